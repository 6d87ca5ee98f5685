# Few-query attention vs SDPA on the real bf16 target: python experiments/engine/attention_speed.py sdpa|ours
import time, torch, sys
torch.set_num_threads(1)
from hyflash.targets import HFTarget
import hyflash.targets.attention as A
from hyflash.corpora import build_prompts
mode = sys.argv[1]
if mode == "sdpa":
    A.use_for = lambda m: False
    import hyflash.targets.hf as hf
t = HFTarget.load("smollm2-135m", dtype="bfloat16")
print(mode, t.model.config._attn_implementation)
ps = [p for p in build_prompts("train", long_chars=16000)[:3000] if p.kind == "long"][:1]
ids = [int(i) for i in t.tokenizer(ps[0].text)["input_ids"]]
for ctx in (256, 1024, 3500):
    t.reset(); t.prefill(ids[:ctx], features=False)
    for q in (1, 8):
        tok = ids[ctx:ctx+q]
        times = []
        for _ in range(5):
            s = time.perf_counter(); t.score(tok, features=False); times.append(time.perf_counter() - s); t.rollback(ctx)
        print(mode, ctx, q, f"{sorted(times)[2]*1000:.1f} ms")
