"""An UNCHANGED user script: greedy generation with a Hugging Face OPT model (ReLU MLPs)
whose forward is compiled with plain torch.compile.

It knows nothing of rocm-autopatch. examples/demo.py runs it with and without the package,
and with a miscompile injected by torch's own fault injection, to show what the numerics
sentinel does. A tiny OPT built from a config with random weights: no download. Runs on
CPU or GPU.
"""

import torch
from transformers import OPTConfig, OPTForCausalLM

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
config = OPTConfig(vocab_size=256, hidden_size=128, ffn_dim=512, num_hidden_layers=1,
                   num_attention_heads=4, max_position_embeddings=128,
                   word_embed_proj_dim=128)
model = OPTForCausalLM(config).to(device).eval()
prompt = torch.randint(4, 256, (1, 8), device=device)


def greedy(forward, steps=8):
    ids = prompt
    with torch.no_grad():
        for _ in range(steps):
            logits = forward(input_ids=ids).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids[0, prompt.shape[1]:].tolist()


eager_tokens = greedy(model)
compiled_tokens = greedy(torch.compile(model.forward))
print("eager   :", eager_tokens)
print("compiled:", compiled_tokens)
print("same tokens:", eager_tokens == compiled_tokens)
