"""A model pair from an eval gin configuration: the eval job's gin route, for every tool.

`parse_config` parses `gin/runs/eval.gin` + experiment files + bindings and rejects bindings the
job cannot honour; `load_pair_from_gin` then builds the speculative model and both parameter sets,
packed once for the CPU kernel (as the job runs them). `decode`, `scripts/profile_tree.py` and
`scripts/gamma_compare.py` load their pair here.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import gin

from specdec_t5x import decoding, gin_utils, speculative


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


# Every argument of the two samplers is set by the job: GAMMA / TEMPERATURE / TOPK / TOPP / SEED /
# TARGET_LEN through `job.evaluate`, the rest by the models per call (T5X's keywords) or left
# at their defaults for baseline and speculative decoding alike (token verification, no early exit:
# block verification and early exit are compared by scripts/gamma_compare.py). A gin binding
# of any of them would be overridden, or would change one decoder or one row only, so it is an error.
PER_CALL_PARAMETERS = [
    *(f"speculative.speculative_sample.{p}" for p in _parameters(speculative.speculative_sample)),
    *(f"decoding.temperature_sample.{p}" for p in _parameters(decoding.temperature_sample)),
    *(
        f"models.{m}.default_decoder_params"
        for m in ("EncoderDecoderModel", "SpeculativeEncoderDecoderModel")
    ),
]
PER_CALL_ROUTE = (
    "the GAMMA / TREES / TREE_RULE / TEMPERATURE / TOPK / TOPP / SEED / TARGET_LEN macros (e.g. "
    "--gin.GAMMA=3); every "
    "row verifies token by token without early exit (block verification and early exit: "
    "scripts/gamma_compare.py)"
)


def parse_config(files: Sequence[str], bindings: Sequence[str], finalize: bool = True) -> None:
    """Parses `gin/runs/eval.gin` + files + bindings; rejects bindings the job cannot honour.

    Raises:
      ValueError: an unset required macro, a macro binding nothing uses (a typo), or a binding of
        a sampler parameter the job sets per call (`PER_CALL_PARAMETERS`).
    """
    gin_utils.parse(["gin/runs/eval.gin", *files], bindings, finalize=False)
    gin_utils.reject_bindings(PER_CALL_PARAMETERS, PER_CALL_ROUTE)
    if finalize:
        gin.finalize()


def load_pair_from_gin(files: Sequence[str], bindings: Sequence[str] = ()):
    """(spec_model, target params, draft params) an eval configuration builds, both parameter
    sets packed once for the CPU kernel (no-op when it is off); gin macros stay queryable.

    Args:
      files: gin files after `gin/runs/eval.gin` (e.g. gin/experiments/embedded_ende_model_t0.gin).
      bindings: gin bindings ('GAMMA = 3', ...).
    """
    parse_config(files, bindings, finalize=False)
    gin.parse_config(
        [
            "pair_model/gin_utils.build.obj = %SPEC_MODEL",
            "pair_params/gin_utils.build.obj = @packed_target/steps.pack_params()",
        ]
    )
    with gin.config_scope("pair_model"):
        spec_model = gin_utils.build()
    with gin.config_scope("pair_params"):
        target_params = spec_model.pack_params(gin_utils.build())  # CPU_WEIGHT_DTYPE
    draft = spec_model.draft
    pack = getattr(draft, "pack_params", None)  # a T5 network draft
    return spec_model, target_params, draft.params if pack is None else pack(draft.params)
