"""envhub: a Gym-style hub of verified environments for reinforcement learning of LLM agents.

    import envhub
    env = envhub.make("countdown")
    messages, info = env.reset(seed=0)

The core imports no torch, no trainer, no environment package: plugins load when an env is asked for.
"""
from envhub.env import (
    Action, ActionSpace, FunctionTool, Message, MessagesSpace, Response, Task, TextEnv, Tool, ToolCall, ToolEnv,
    ToolResult, ToolSpec, finish_tool,
)
from envhub.hookspecs import hookimpl
from envhub.spec import EnvSpec
from envhub.verifier import FunctionVerifier, Score, Verifier, WeightedVerifier

__version__ = "0.1.0"

__all__ = [
    "Action", "ActionSpace", "EnvSpec", "FunctionTool", "FunctionVerifier", "Message", "MessagesSpace", "Response",
    "Score", "Task", "TextEnv", "Tool", "ToolCall", "ToolEnv", "ToolResult", "ToolSpec", "Verifier",
    "WeightedVerifier", "finish_tool", "get_spec", "hookimpl", "list_envs", "make",
]


def get_spec(env_id: str) -> EnvSpec:
    """The registered spec of ``env_id`` (imports only its plugin)."""
    from envhub.plugins import default_hub

    return default_hub().get(env_id)


def make(env_id: str, **kwargs) -> TextEnv:
    """A new env of ``env_id`` (kwargs go to the env factory; ``grade=True`` attaches the verifier)."""
    return get_spec(env_id).make(**kwargs)


def list_envs() -> list[str]:
    """Ids of every installed env (metadata only: no plugin is imported)."""
    from envhub.plugins import default_hub

    return default_hub().ids()


def _register_gym_ids() -> None:
    from envhub.plugins import register_gym_ids

    try:
        register_gym_ids()
    except Exception:  # never let a broken install make `import envhub` fail, but say why ids are missing
        import logging

        logging.getLogger("envhub").warning("could not register envhub's Gymnasium ids (`gymnasium.make` of "
                                            "envhub/<id> will not find them)", exc_info=True)


_register_gym_ids()
