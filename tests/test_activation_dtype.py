"""`T5Config.dtype`: float32 and bfloat16 activations are accepted, float16 is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from specdec_t5x import network


@pytest.mark.parametrize("dtype", [jnp.float32, "float32", np.float32, jnp.bfloat16, "bfloat16"])
def test_float32_and_bfloat16_accepted(dtype):
    assert tiny_config(dtype=dtype).dtype == dtype


@pytest.mark.parametrize("dtype", [jnp.float16, "float16", np.dtype("float16")])
def test_float16_refused_with_the_reason(dtype):
    with pytest.raises(
        ValueError, match=r"float16.*'float32', 'bfloat16'|'float32', 'bfloat16'.*float16"
    ) as err:
        tiny_config(dtype=dtype)
    assert "-1e10" in str(err.value) and "NaN" in str(err.value)


@pytest.mark.parametrize("dtype", ["hot", jnp.int32, "float64"])
def test_other_dtypes_refused(dtype):
    with pytest.raises(
        ValueError, match=r"T5Config\.dtype must be one of \('float32', 'bfloat16'\)"
    ):
        tiny_config(dtype=dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_why_float16_is_refused():
    # The reason, in numbers: T5X's mask value stays finite in the accepted dtypes and overflows
    # float16, where a fully masked row's softmax is NaN.
    for dtype in (jnp.float32, jnp.bfloat16):
        assert jnp.isfinite(jnp.asarray(network.NEG_INF, dtype))
    masked = jnp.full((3,), network.NEG_INF, jnp.float16)
    assert jnp.isneginf(masked).all()
    assert jnp.isnan(jax.nn.softmax(masked)).all()
