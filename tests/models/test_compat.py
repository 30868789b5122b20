from types import SimpleNamespace

from transformers.modeling_outputs import CausalLMOutputWithPast

from harmonyrl.models.compat import cache_kwarg, output_cache


def test_cache_kwarg_follows_the_signature() -> None:
    def new_style(input_ids: object = None, cache: object = None) -> None: ...

    def old_style(input_ids: object = None, past_key_values: object = None) -> None: ...

    assert cache_kwarg(new_style) == "cache"
    assert cache_kwarg(old_style) == "past_key_values"


def test_output_cache_reads_either_spelling() -> None:
    marker = object()
    assert output_cache(SimpleNamespace(past_key_values=marker)) is marker  # transformers < 5.24
    assert output_cache({"cache": marker}) is marker  # transformers >= 5.24 outputs are dict-like
    assert output_cache(SimpleNamespace()) is None


def test_output_cache_on_the_installed_output_class() -> None:
    marker = object()
    field = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
    assert output_cache(CausalLMOutputWithPast(**{field: marker})) is marker
