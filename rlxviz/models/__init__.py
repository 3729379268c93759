"""Model graphs: BERT (RLX and Hugging Face styles), presets, checkpoints."""

from .bert import VARIANTS, BertConfig, Variant, build_bert, random_feeds, random_weights, rlx_weights_from_hf
from .presets import PRESETS, Model, load_model, preset

__all__ = ["PRESETS", "VARIANTS", "BertConfig", "Model", "Variant", "build_bert", "load_model", "preset",
           "random_feeds", "random_weights", "rlx_weights_from_hf"]
