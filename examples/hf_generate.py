"""An UNCHANGED user script: a Hugging Face causal LM whose forward is compiled with
mode="reduce-overhead" (Inductor CUDA graphs: hangs or wrong results on ROCm).

It knows nothing of rocm-autopatch. Run it with the package installed; on ROCm (or with
ROCM_AUTOPATCH=force anywhere) the compile runs in a safe mode and the tokens equal eager.
A tiny Llama built from a config with random weights: no download. Runs on CPU or GPU.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=128)
model = LlamaForCausalLM(config).to(device).eval()
prompt = torch.randint(0, 256, (1, 8), device=device)


def greedy(forward, steps=8):
    ids = prompt
    with torch.no_grad():
        for _ in range(steps):
            logits = forward(input_ids=ids).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids[0, prompt.shape[1]:].tolist()


eager_tokens = greedy(model)
compiled_forward = torch.compile(model.forward, mode="reduce-overhead")
compiled_tokens = greedy(compiled_forward)
print("eager   :", eager_tokens)
print("compiled:", compiled_tokens)
print("same tokens:", eager_tokens == compiled_tokens)
