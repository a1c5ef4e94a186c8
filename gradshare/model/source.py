"""What the light processes need to know of the model, without torch: its config's file, the
forms `model.source` may take and the refusal of one no step could load, and the parameter shapes
(torch and transformers are loaded only where they are computed, not where they are read).

    from gradshare.model.source import check_model_source
    check_model_source(load_plan("full"))      # PlanError naming the field and the allowed forms
"""
from __future__ import annotations

import json
from pathlib import Path

from gradshare.contract.plan import PlanError
from gradshare.util.hashing import sha256_file
from gradshare.util.kept import kept

CONFIG_DIR = Path(__file__).parent / "configs"


def model_config(name: str, vocab_size: int | None = None):
    from transformers import Qwen3Config

    path = CONFIG_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"model config {name!r} not in {CONFIG_DIR}")
    cfg = json.loads(path.read_text())
    if vocab_size is not None and "vocab_size" not in cfg:
        cfg["vocab_size"] = vocab_size
    return Qwen3Config(**cfg)


MODEL_SHAPES = "model_shapes.json"  # prepare's record of parameter_shapes(plan), an artifact of its run


def parameter_shapes(plan) -> list[tuple[int, ...]]:
    """The plan's model's trainable parameter shapes, from its config on the meta device (no
    weights are made); kept after the first time for the same config file, vocabulary, code and
    torch and transformers versions (`gradshare.util.kept`): loading them costs about 6 CPU-s, in
    every `analyze` of a study that projects the full model."""
    def compute() -> list[list[int]]:
        import torch  # deferred: the launcher and the light steps read recorded shapes, never these
        from transformers import Qwen3ForCausalLM

        with torch.device("meta"):
            model = Qwen3ForCausalLM(model_config(plan.model.config, plan.model.vocab_size))
        return [list(p.shape) for p in model.parameters() if p.requires_grad]

    config = CONFIG_DIR / plan.model.config
    key = {"config": plan.model.config, "config_sha256": sha256_file(config) if config.exists() else None,
           "vocab_size": plan.model.vocab_size}
    return [tuple(s) for s in kept("shapes", key, compute, libraries=("torch", "transformers"), log=lambda *a: None)]


# The forms `model.source` may take; every refusal of `check_model_source` ends with them.
SOURCE_FORMS = ("tiny (built from model.config and pre-trained by prepare), hf:/local/dir (a local Hugging "
                "Face causal LM: config.json, weights and tokenizer), or random-qwen3-1.7b (random weights "
                "of model.config's shape, throughput only)")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # what `load_tokenizer` reads


def check_model_source(plan, base: str | Path | None = None) -> None:
    """Refuse, before any run, a model the steps could not load: a `model.source` of none of
    the three forms; an `hf:` path that does not exist, holds no config.json, whose config is
    not a causal LM (its model type has no AutoModelForCausalLM class, or its `architectures`
    name none), or that holds no weights or no tokenizer; a `model.config` that is not in
    gradshare/model/configs. Raises PlanError naming the field, what is wrong and the allowed forms.

    Local files only (transformers is asked with local_files_only, never the Hub). `base`:
    the directory a relative `hf:` path is taken from, where the steps will run (default: here).
    """

    m = plan.model
    src = m.source

    def refuse(what: str):
        raise PlanError(f"model.source={src!r} {what}; model.source is one of: {SOURCE_FORMS}")

    if src == "tiny" or src.startswith("random-"):
        if not (CONFIG_DIR / m.config).is_file():
            known = ", ".join(sorted(p.name for p in CONFIG_DIR.glob("*.json")))
            raise PlanError(f"model.config={m.config!r} is not a file in gradshare/model/configs, which "
                            f"model.source={src} is built from: choose one of {known}")
        return
    if not src.startswith("hf:") or not src[3:].strip():
        refuse("is none of the allowed forms")
    path = Path(base or ".") / src[3:]  # an absolute path stays itself
    if not path.exists():
        refuse(f"names {path}, which does not exist")
    if not path.is_dir():
        refuse(f"names {path}, which is not a directory")
    if not (path / "config.json").is_file():
        refuse(f"names {path}, which holds no config.json: not a Hugging Face model directory")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # an unknown model type, broken JSON, remote code: all unloadable
        refuse(f"names {path}, whose config.json transformers cannot read "
               f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]})")
    causal = {n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in ((v,) if isinstance(v, str) else v)}
    archs = list(getattr(cfg, "architectures", None) or [])
    # Both: BERT's type has a causal-LM class (BertLMHeadModel), but a BERT checkpoint's head
    # (BertForMaskedLM) is not one; a saved causal LM names its class in `architectures`.
    if type(cfg) not in AutoModelForCausalLM._model_mapping or not set(archs) & causal:
        named = f"architectures {archs}" if archs else "no architectures"
        refuse(f"names {path}, whose config.json describes a {cfg.model_type!r} model with {named}, not "
               f"a causal LM: its `architectures` must name a class AutoModelForCausalLM loads, such "
               f"as Qwen3ForCausalLM")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        refuse(f"names {path}, which holds no weights: expected one of {', '.join(WEIGHT_FILES)}")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        refuse(f"names {path}, which holds no tokenizer: expected {' or '.join(TOKENIZER_FILES)} "
               f"(prepare takes the model's own tokenizer)")
