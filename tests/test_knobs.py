"""Each engine knob stated once (`Knob` in `Capabilities.knobs`), and each adapter's arguments one typed,
frozen class. What must not move: the four per-knob maps the strategies and checks read (now derived
views) hold exactly what the adapters' own maps held, so the derandomised stream is unchanged; old
histories, which recorded those maps, still read; a bad engine argument is one clear UsageError line."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import pytest

from conformance.contract import Capabilities, UsageError

from conformance.knobs import Knob
from conformance.history_codec import capabilities_from, encode
from conformance.untrusted import check_history_configs

# What adapters/reference.py declared as four maps before knobs were one value (main 8cce09d).
REFERENCE_MAPS = {
    "config_space": {"block_size": (16, 4, 32), "pool_tokens": (4096, 64, 256),
                     "drafter": ("none", "oracle", "adversarial", "draft", "ngram"), "k": (3, 1, 5),
                     "chunk_size": ("none", 13, 16), "token_budget": (4096, 24)},
    "knob_roles": {"block_size": "cache", "pool_tokens": "cache", "drafter": "speculation", "k": "speculation",
                   "chunk_size": "schedule", "token_budget": "schedule"},
    "prefix_caching_off": {},
    "context_limits": {"pool_tokens": {"4096": 4096, "64": 64, "256": 256}},
}
SMALL = dict(name="t", vocab_size=64, max_context=256)


def views(caps: Capabilities) -> dict:
    return {name: getattr(caps, name) for name in REFERENCE_MAPS}


def assert_same_maps(got: dict, want: dict) -> None:
    """Equal, and in the same key order (the strategies iterate some maps unsorted)."""
    assert got == want
    for name in want:
        assert list(got[name]) == list(want[name]), name


def test_reference_knob_views_equal_the_old_maps():
    from adapters.reference import ReferenceAdapter

    caps = ReferenceAdapter().capabilities()
    assert_same_maps(views(caps), REFERENCE_MAPS)
    pool = next(k for k in caps.knobs if k.name == "pool_tokens")
    assert pool.context_limits == {4096: 4096, 64: 64, 256: 256}  # keyed by the value itself


def test_transformers_knob_views_equal_the_old_maps():
    pytest.importorskip("transformers")
    from adapters.transformers import TransformersAdapter

    a = TransformersAdapter(modes="generate,batch")
    want = {"config_space": {"mode": ("generate", "batch"), "k": (1, 3, 5)},
            "knob_roles": {"mode": "schedule", "k": "speculation"}, "prefix_caching_off": {}, "context_limits": {}}
    assert_same_maps(views(a.capabilities()), want)


def test_the_four_maps_still_build_capabilities_and_evolve_one_view_at_a_time():
    old = Capabilities(**SMALL, config_space={"prefix": ("true", "false"), "chunk": (0, 8)},
                       knob_roles={"prefix": "cache", "chunk": "schedule"}, prefix_caching_off={"prefix": ("false",)},
                       context_limits={"chunk": {"8": 100}})
    assert old.knobs == (Knob("prefix", ("true", "false"), "cache", ("false",)),
                         Knob("chunk", (0, 8), "schedule", context_limits={8: 100}))
    assert old == Capabilities(**SMALL, knobs=old.knobs)
    moved = attrs.evolve(old, knob_roles={"prefix": "cache", "chunk": "cache"})  # the other maps are kept
    assert moved.knob_roles == {"prefix": "cache", "chunk": "cache"}
    assert moved.prefix_caching_off == {"prefix": ("false",)} and moved.context_limits == {"chunk": {"8": 100}}
    assert attrs.evolve(old, config_space={}).knobs == ()


def test_a_history_records_knobs_and_reads_them_back():
    from adapters.reference import ReferenceAdapter

    caps = ReferenceAdapter().capabilities()
    recorded = json.loads(json.dumps(encode(caps)))
    assert "knobs" in recorded and "config_space" not in recorded
    assert capabilities_from(recorded) == caps


def test_an_old_history_with_the_four_maps_still_reads():
    """run_start as histories recorded it before knobs: maps, lists for tuples, str(value) keys."""
    old = {**SMALL, "config_space": {"pool_tokens": [4096, 64], "prefix_cache": ["true", "false"]},
           "knob_roles": {"pool_tokens": "cache", "prefix_cache": "cache"},
           "prefix_caching_off": {"prefix_cache": ["false"]}, "context_limits": {"pool_tokens": {"64": 64}}}
    caps = capabilities_from(old)
    assert caps.knobs == (Knob("pool_tokens", (4096, 64), "cache", context_limits={64: 64}),
                          Knob("prefix_cache", ("true", "false"), "cache", ("false",)))
    assert caps.context_limits == {"pool_tokens": {"64": 64}}  # the view the strategies look up
    # the oldest: no knob_roles; roles guessed from the names, as those histories were first judged
    oldest = capabilities_from({**SMALL, "config_space": {"spec_k": [0, 2], "prefix": ["on", "off"]}})
    assert oldest.knob_roles == {"spec_k": "speculation", "prefix": "cache"}
    assert oldest.prefix_caching_off == {"prefix": ("false", "0", "off", "none")}


def test_a_recorded_knob_still_fences_a_historys_configurations():
    """The fail-closed check on replayed histories reads the declared values from `knobs` now."""
    caps = encode(Capabilities(**SMALL, knobs=(Knob("k", (1, 3), "speculation"),)))
    ok = [{"event": "run_start", "capabilities": caps}, {"event": "config", "config": {"k": 3}}]
    check_history_configs(ok, "h")
    with pytest.raises(UsageError, match="not one of the engine's declared values"):
        check_history_configs([ok[0], {"event": "config", "config": {"k": 99}}], "h")
    with pytest.raises(UsageError, match="does not declare"):
        check_history_configs([ok[0], {"event": "config", "config": {"pool_tokens": 64}}], "h")
    with pytest.raises(UsageError, match="knobs are not a list"):
        check_history_configs([{"event": "run_start", "capabilities": {**caps, "knobs": {"k": 1}}}], "h")
    with pytest.raises(UsageError, match="knobs are not a list"):
        check_history_configs([{"event": "run_start", "capabilities": {**caps, "knobs": [{"name": "k", "values": 3}]}}], "h")


def args_classes():
    from adapters.llama_cpp_args import LlamaCppArgs
    from adapters.openai_http.args import OpenAIHttpArgs
    from adapters.reference import ReferenceArgs
    from adapters.transformers_args import TransformersArgs
    from adapters.vllm_args import VllmArgs

    return {"reference": ReferenceArgs, "openai_http": OpenAIHttpArgs, "vllm": VllmArgs,
            "llama_cpp": LlamaCppArgs, "transformers": TransformersArgs}


@pytest.mark.parametrize("engine, args, message", [
    ("reference", {"k": "two"}, "engine argument k='two' is not an integer"),
    ("reference", {"pool_tokens": "0"}, "engine argument pool_tokens=0 must be >= 1"),
    ("reference", {"fault": "no_such_fault"}, "fault='no_such_fault'"),
    ("reference", {"colour": "red"}, "unknown reference engine argument(s) ['colour']"),
    ("openai_http", {"serve": "kvparity", "spec": "ngram"}, "spec= only applies with serve=vllm"),
    ("openai_http", {"serve": "kvparity", "base_url": "http://127.0.0.1:1"}, "give exactly one of base_url"),
    ("openai_http", {"base_url": "http://127.0.0.1:1", "knobs": "k:2"}, "only apply with serve=kvparity"),
    ("openai_http", {"serve": "kvparity", "extra_body": "[1]"}, "extra_body= must be a JSON object"),
    ("openai_http", {"serve": "kvparity", "timeout": "0.5"}, "engine argument timeout=0.5 must be >= 1"),
    ("vllm", {"block_size": "48"}, "block_size=48: vLLM CPU needs a multiple of 32"),
    ("vllm", {"vary": "spec,colour"}, "vary: unknown knob 'colour'"),
    ("llama_cpp", {"kv_type": "q4"}, "engine argument kv_type='q4': choose one of f32, f16"),
    ("transformers", {"modes": "generate,warp"}, "engine argument modes='generate,warp'"),
])
def test_a_bad_engine_argument_is_one_usage_error_line(engine, args, message):
    from adapters.engine_args import parse

    with pytest.raises(UsageError) as err:
        parse(args_classes()[engine], engine, args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_string_engine_arguments_still_build_an_adapter_and_come_out_typed():
    """The registry (and any third-party caller) builds adapters as `Cls(**engine_args)` with strings."""
    from adapters.reference import ReferenceAdapter, ReferenceArgs

    a = ReferenceAdapter(k="2", pool_tokens="64", prefix_cache="off", chunk_size="0", introspection="false")
    assert a.args == ReferenceArgs(k=2, pool_tokens=64, prefix_cache=False, chunk_size=None, introspection=False)
    assert a.config.num_blocks == 4 and not a.capabilities().introspection
    assert ReferenceAdapter(a.args).config == a.config  # or from the parsed class itself
    with pytest.raises(UsageError, match="not both"):
        ReferenceAdapter(a.args, k="3")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        a.args.k = 5


def test_the_cli_says_a_bad_engine_argument_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kvparity", "run", "--engine", "reference", "--engine-arg", "k=two",
                        "--profile", "ci", "-q", "--report-dir", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 3
    assert r.stderr.strip().splitlines() == ["kvparity: error: engine argument k='two' is not an integer"]


def test_an_adapters_signature_still_lists_its_engine_arguments_as_the_command_line_says_them():
    """`kvparity export` (and any tool) reads an adapter's arguments and their defaults from its
    constructor; with the arguments a class, the constructor advertises the class's fields."""
    import inspect

    from adapters.openai_http import OpenAIHttpAdapter
    from adapters.openai_http.args import OpenAIHttpArgs

    params = inspect.signature(OpenAIHttpAdapter.__init__).parameters
    assert list(params)[1:] == [a.name for a in attrs.fields(OpenAIHttpArgs)]
    assert (params["salt"].default, params["tolerance"].default, params["k"].default) == ("auto", "auto", 3)
    parsed = OpenAIHttpArgs(serve="kvparity")  # a default is converted like any argument
    assert (parsed.salt, parsed.tolerance, parsed.extra_body, parsed.max_num_batched_tokens) == (None, None, {}, None)


def test_a_speculation_knobs_off_values_are_recorded_and_kept_but_are_not_the_caches():
    drafter = Knob("drafter", ("none", "ngram"), "speculation", ("none",))
    caps = Capabilities(**SMALL, knobs=(drafter, Knob("prefix", ("true", "false"), "cache", ("false",))))
    assert caps.prefix_caching_off == {"prefix": ("false",)}
    recorded = json.loads(json.dumps(encode(caps)))
    assert capabilities_from(recorded).knobs == caps.knobs
    # a history written before speculation knobs had off values recorded them as prefix_caching_off
    legacy = {**recorded, "knobs": [{**{n: v for n, v in k.items() if n != "off"}, "prefix_caching_off": k["off"]}
                                    for k in recorded["knobs"]]}
    assert capabilities_from(legacy).knobs[1].off == ("false",)
    # ... and had no off values for speculation: "none" (and "off", "0", "false") read as off, as then meant
    assert capabilities_from(legacy).knobs[0].off == ("none",)
    # evolving one of the earlier maps keeps what the maps cannot say
    assert attrs.evolve(caps, knob_roles={"drafter": "speculation", "prefix": "cache"}).knobs[0].off == ("none",)
    assert drafter.switches_off("None") and not drafter.switches_off("ngram")
    # an adapter still giving the four maps cannot say it either: read the same way
    maps = Capabilities(**SMALL, config_space={"k": (0, 2), "prefix": ("on", "off")},
                        knob_roles={"k": "speculation", "prefix": "cache"})
    assert [k.off for k in maps.knobs] == [(0,), ()]
