"""What the installed transformers can do, found by probing the library itself: the one place where the
transformers adapter knows that releases differ (4.38 to 5.x).

Users run many releases, and a feature an old release lacks must not be claimed (the vacuity guard then
asks for it and the run would be inconclusive for a reason that is not the engine's) nor faked. So every
difference is a probe of the imported module (a class attribute, a signature, an importable name), never a
table of version numbers: a backport or a renamed release is judged by what it has.

The differences the adapter meets, oldest first:
  - `from_pretrained(torch_dtype=)` until the configs renamed the field to `dtype` (the old name survives as
    a compatibility property); before that rename an unknown `dtype=` is silently stored on the config and
    the weights load in float32.
  - prompt lookup decoding exists where `GenerationConfig` has `prompt_lookup_num_tokens`.
  - the assistant's draft length, schedule and confidence threshold are read from the *assistant's* own
    generation config (passing them to `generate` does not reach the candidate generator); the threshold
    exists only in later releases (and stops drafts early unless set to 0).
  - `output_logits` in assisted generation: one tensor per verification, `[batch, candidates + 1, vocab]`,
    rows past the accepted ones included, until it became one `[batch, vocab]` tensor per output token.
  - continuous batching with block sharing: `generate_batch(..., continuous_batching_config=,
    persistent_manager=)`, `ContinuousBatchingConfig(allow_block_sharing=)` and the paged cache's
    `search_prefix_match` (how the adapter observes prefix hits); a release without all of them gets no
    `batch` mode.
  - the page size of `ContinuousBatchingConfig` is the keyword `block_size` in the releases that first
    have block sharing (5.4 to 5.17) and `page_size` from 5.18: passing the other name is a TypeError, so the
    adapter passes the field the class's signature names (`page_field`).
  - a persistent manager numbers its requests across calls (`req_0`, `req_1`, ...). Until
    `ContinuousBatchingManager.add_requests` returned the ids it gave (5.9), `generate_batch` looked its
    results up as `req_0 .. req_{n-1}` and so returned nothing from the second call on (5.4 to 5.8: the
    first `batch` call works, every later one comes back empty). A manager whose `add_requests` is declared
    to return None gets no `batch` mode: it cannot answer a stream (reports/transformers/compat.md).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Sequence

from attrs import frozen


@frozen
class Features:
    """The capabilities of one imported transformers, as the adapter uses them."""

    version: str
    dtype_kwarg: str  # the from_pretrained keyword for the weights' dtype: "dtype" or "torch_dtype"
    prompt_lookup: bool  # GenerationConfig.prompt_lookup_num_tokens
    assistant_fields: tuple[str, ...]  # the draft knobs the assistant's GenerationConfig has
    continuous_batching: bool  # generate_batch with a persistent manager, block sharing, observable hits
    page_field: str = "page_size"  # ContinuousBatchingConfig's keyword for the page size ("" where no batch mode)

    @property
    def modes(self) -> tuple[str, ...]:
        """The adapter modes this release can run (before the question of an assistant checkpoint)."""
        return tuple(m for m, ok in (("generate", True), ("assisted", True), ("adversarial", True),
                                     ("prompt_lookup", self.prompt_lookup), ("batch", self.continuous_batching))
                     if ok)


def probe(tf: Any, import_module: Callable[[str], Any] = importlib.import_module) -> Features:
    """Read the features of the imported `transformers` module `tf`; `import_module` finds its submodules
    (a test passes fakes of both)."""
    config_cls = tf.PretrainedConfig
    renamed = isinstance(inspect.getattr_static(config_cls, "torch_dtype", None), property)
    generation_defaults = tf.GenerationConfig()
    page_field = _continuous_batching_page_field(tf, import_module)
    fields = tuple(f for f in ("num_assistant_tokens", "num_assistant_tokens_schedule",
                               "assistant_confidence_threshold") if hasattr(generation_defaults, f))
    return Features(
        version=str(getattr(tf, "__version__", "?")),
        dtype_kwarg="dtype" if renamed else "torch_dtype",
        prompt_lookup=hasattr(generation_defaults, "prompt_lookup_num_tokens"),
        assistant_fields=fields,
        continuous_batching=bool(page_field),
        page_field=page_field,
    )


# The names ContinuousBatchingConfig has given its page size, newest first (5.18+: page_size; 5.4-5.17:
# block_size; reports/transformers/compat.md). The adapter passes the one the signature has; a release
# with neither gets no batch mode.
PAGE_FIELDS = ("page_size", "block_size")


def _continuous_batching_page_field(tf: Any, import_module: Callable[[str], Any]) -> str:
    """The page-size keyword of the release's ContinuousBatchingConfig when it has everything the `batch`
    mode uses (a persistent manager, block sharing, observable prefix hits); "" when it lacks any."""
    generate_batch = getattr(getattr(tf, "GenerationMixin", None), "generate_batch", None)
    if generate_batch is None:
        return ""
    if not {"continuous_batching_config", "persistent_manager"} <= set(inspect.signature(generate_batch).parameters):
        return ""
    try:
        config_cls = import_module("transformers.generation.configuration_utils").ContinuousBatchingConfig
        cache_cls = import_module("transformers.generation.continuous_batching.cache").PagedAttentionCache
        manager_cls = import_module("transformers.generation.continuous_batching").ContinuousBatchingManager
    except (ImportError, AttributeError):
        return ""
    fields = inspect.signature(config_cls).parameters
    page_field = next((f for f in PAGE_FIELDS if f in fields), "")
    if "allow_block_sharing" not in fields or not hasattr(cache_cls, "search_prefix_match"):
        return ""
    return page_field if _later_calls_return_results(manager_cls) else ""


def _later_calls_return_results(manager_cls: Any) -> bool:
    """Whether `generate_batch` finds a persistent manager's results after its first call: it does where
    `add_requests` returns the ids it gave them; declared `-> None`, `generate_batch` assumes `req_0..`
    and a reused manager's later calls come back empty. No annotation at all reads as returning them
    (the later releases' shape; a wrong guess is an engine error in the run, not a silent pass)."""
    add_requests = getattr(manager_cls, "add_requests", None)
    if add_requests is None:
        return False
    returns = inspect.signature(add_requests).return_annotation
    return returns is not None and returns != "None"


def batching_config_kwargs(features: Features, page_size: int) -> dict[str, int]:
    """The ContinuousBatchingConfig keyword that sets the page size, under this release's name for it."""
    return {features.page_field: page_size}


def load_kwargs(features: Features, dtype: Any) -> dict[str, Any]:
    """The from_pretrained keywords that load the weights in `dtype`."""
    return {features.dtype_kwarg: dtype}


def configure_assistant(features: Features, assistant: Any, k: int) -> None:
    """Make the assistant draft exactly `k` tokens per verification, every time: a constant schedule (the
    heuristic one rewrites the assistant's config after each call, so one request would change the next)
    and, where the release has one, a confidence threshold of 0 (else drafts stop early)."""
    values = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": 0.0}
    for field in features.assistant_fields:
        setattr(assistant.generation_config, field, values[field])


def per_token_logits(logits: Sequence[Any], accepted: Sequence[int]) -> list[Any]:
    """`generate(..., output_logits=True).logits` as one `[batch, vocab]` tensor per output token.

    A release that records assisted generation per verification gives `[batch, candidates + 1, vocab]`
    tensors; `accepted` is the number of drafted tokens the verification of each accepted (the adapter
    observes it), so the first `accepted + 1` rows are the logits of the tokens that verification output.
    Per-token tensors pass through unchanged."""
    if all(t.dim() == 2 for t in logits):
        return list(logits)
    if len(logits) != len(accepted):
        raise ValueError(f"{len(logits)} verification logits for {len(accepted)} observed verifications")
    rows = []
    for tensor, n in zip(logits, accepted):
        rows.extend(tensor[:, i, :] for i in range(min(int(n) + 1, tensor.shape[1])))
    return rows
