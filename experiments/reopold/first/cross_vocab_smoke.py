import time, torch
torch.set_num_threads(1)
from hyflash.distill import tasks, rollout
from hyflash.distill.student import load_model, truncate_layers
teacher, ttok = load_model("gemma3-270m", "bfloat16")
student, stok = load_model("smollm2-135m", "bfloat16")
probs = tasks.arithmetic_split("train", 3, 0)
r = rollout.sample(student, stok, [p.prompt for p in probs], 20, 1.0, torch.Generator().manual_seed(0))
t0 = time.time()
credited = rollout.teacher_scores_cross_vocab(teacher, ttok, stok, r)
print("secs", time.time() - t0)
for row in range(3):
    toks = r.response[row][r.valid[row]].tolist()
    print(repr(r.texts[row]))
    print([ (stok.decode([t]), round(float(c), 2)) for t, c in zip(toks, credited[row]) ])
    p_ids = ttok(r.prompts[row])["input_ids"]; t_ids = ttok(r.texts[row], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lg = teacher(torch.tensor([p_ids + t_ids])).logits[0, len(p_ids)-1:-1].float()
    print("sum credited", float(credited[row].sum()), "teacher total", float(torch.log_softmax(lg, -1).gather(-1, torch.tensor(t_ids)[:, None]).sum()), "bos", p_ids[:2])
# teacher accuracy check on a few test problems (greedy)
test = tasks.arithmetic_split("test", 32, 0)
g = rollout.sample(teacher, ttok, [p.prompt for p in test], 20, 0)
print("gemma acc on 32 test", sum(tasks.is_correct(p, t) for p, t in zip(test, g.texts)) / 32, g.texts[:3])
