"""Model graphs: BERT (RLX and Hugging Face styles), LLaMA block, presets, checkpoints.

Importing this package registers every preset (`minilm` and `llama-block` register from their modules).
"""

from .bert import VARIANTS, BertConfig, Variant, build_bert, random_feeds, random_weights, rlx_weights_from_hf
from .checkpoint import CheckpointError, load_checkpoint
from .llama import LlamaConfig, build_llama_block, llama_random_weights, rope_tables
from .minilm import minilm_dir, sentence_embeddings, tokenize
from .presets import PRESETS, Model, load_model, preset

__all__ = ["PRESETS", "VARIANTS", "BertConfig", "CheckpointError", "LlamaConfig", "Model", "Variant", "build_bert",
           "build_llama_block", "llama_random_weights", "load_checkpoint", "load_model", "minilm_dir", "preset",
           "random_feeds", "random_weights", "rlx_weights_from_hf", "rope_tables", "sentence_embeddings", "tokenize"]
