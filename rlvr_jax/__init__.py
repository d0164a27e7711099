"""rlvr_jax: reinforcement learning with verifiable rewards for language models, in JAX.

The pure math (advantages, losses, regularizers, logprobs) is importable on its own:

    from rlvr_jax import advantages, losses, regularizers, logprobs
"""

__version__ = "0.1.0"
