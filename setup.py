"""specdec_t5x: speculative decoding (Leviathan et al., 2022) for T5X-style encoder-decoder models."""

import logging
import os

import setuptools
from setuptools.command.build_ext import build_ext

# Pinned to a set that resolves together on Python 3.11 with plain pip (checked 2026-11-30).
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "tensorstore==0.1.86",
    "msgpack==1.2.4",
    "safetensors==0.8.0",
    "gin-config==0.5.0",
    "seqio==0.0.20",
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    "importlib_resources==7.1.0",  # tensorflow-datasets reads its dataset metadata with it
    "sentencepiece==0.2.3",
    "sacrebleu==2.6.0",
    "rouge-score==0.1.2",
    "numpy==2.4.6",
    "scipy==1.17.1",  # theory.expected_iterations (a jax requirement too)
    "absl-py==2.5.1",
    "tqdm==4.70.1",
    "matplotlib==3.11.2",
]

EXTRAS_REQUIRE = {
    "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "scipy==1.17.1", "ruff==0.17.6"],
    # Hugging Face interop and the side-by-side benchmark (CPU torch from the local wheel).
    "hf": ["torch==2.13.0", "transformers"],
}



class OptionalBuildExt(build_ext):
    """Builds the CPU matmul kernel (specdec_t5x/cpu_kernel) if it can; never fails the install.

    Without a C++ compiler (or jaxlib's FFI headers) the package installs anyway and decodes with
    `jnp.dot` (specdec_t5x.cpu_kernel logs that once at run time).
    """

    def build_extension(self, ext):
        try:
            import jaxlib  # build requirement (pyproject.toml), same pin as INSTALL_REQUIRES

            ext.include_dirs.append(os.path.join(os.path.dirname(jaxlib.__file__), "include"))
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001 - any build failure leaves the jnp.dot path
            logging.warning("specdec_t5x: CPU kernel not built (%s); using jnp.dot.", err)


CPU_KERNEL = setuptools.Extension(
    "specdec_t5x.cpu_kernel._matmul",
    sources=["specdec_t5x/cpu_kernel/matmul.cc", "specdec_t5x/cpu_kernel/attention.cc"],
    depends=["specdec_t5x/cpu_kernel/attention_simd.h"],
    language="c++",
    # Portable baseline: the AVX-512 / AVX2 paths are per-function target attributes chosen at run
    # time (__builtin_cpu_supports), never -march=native.
    extra_compile_args=["-O3", "-std=c++17", "-Wno-return-type"],
)

setuptools.setup(
    name="specdec_t5x",
    version="0.1.0",
    description="Exact speculative decoding for T5X-compatible encoder-decoder models in JAX/Flax.",
    packages=setuptools.find_packages(include=["specdec_t5x", "specdec_t5x.*"]),
    # gin/: the shipped gin files (the repository's ./gin links to specdec_t5x/gin), so an installed
    # package serves `include 'gin/...'` to T5X's binaries (--gin_search_paths).
    package_data={
        "specdec_t5x": [
            "assets/*",
            "assets/**/*",
            "cpu_kernel/*.cc",
            "cpu_kernel/*.h",
            "gin/*/*.gin",
        ]
    },
    ext_modules=[CPU_KERNEL],
    cmdclass={"build_ext": OptionalBuildExt},
    include_package_data=True,
    python_requires=">=3.11,<3.12",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
