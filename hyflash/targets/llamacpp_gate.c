/* The eval callback's question, answered in C (hyflash/targets/llamacpp_gate.py builds and loads this file).

   llama.cpp asks the eval callback about every node of every graph it computes (~1,100 a pass on
   SmolLM2-135M) whether it wants that node's data. Through a Python callback each question costs a few
   microseconds: ~9% of a plain step on llama.cpp, paid by every pass of a context that has a callback, even
   when nothing is recorded. This gate answers the question here, by comparing the node's name with the
   wanted ones, and calls the Python callback only for a wanted node's data (ask = false): a few calls a pass
   instead of ~1,100. When the target is not recording it wants nothing, and no Python runs at all. */
#include <stdbool.h>
#include <string.h>

struct ggml_tensor;
typedef bool (*eval_callback)(struct ggml_tensor *, bool, void *);
typedef const char *(*name_of)(const struct ggml_tensor *);

#define GATE_NAMES 8
#define GATE_NAME_BYTES 64 /* GGML_MAX_NAME */

struct hyflash_gate {
    int recording;                                /* set by Python around each llama_decode */
    int n_names;
    char names[GATE_NAMES][GATE_NAME_BYTES];      /* the wanted nodes' names */
    name_of get_name;                             /* ggml_get_name */
    eval_callback on_data;                        /* the Python callback, called with ask = false */
    void *on_data_user;
};

bool hyflash_gate_eval(struct ggml_tensor *t, bool ask, void *user) {
    struct hyflash_gate *gate = (struct hyflash_gate *)user;
    if (!gate->recording)
        return !ask; /* nothing wanted; a data call (none should come) continues the graph */
    if (!ask)
        return gate->on_data(t, false, gate->on_data_user);
    const char *name = gate->get_name(t);
    for (int i = 0; i < gate->n_names; i++)
        if (strncmp(name, gate->names[i], GATE_NAME_BYTES) == 0)
            return true;
    return false;
}
