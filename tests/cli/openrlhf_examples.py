"""OpenRLHF's example command lines (``python3 -m openrlhf.cli.train_ppo_ray`` in OpenRLHF 0.11's
examples/scripts and README), retyped as data for the parity test (tests/cli/test_openrlhf_example_parity.py).

Only the flag lists are taken, in the scripts' order. What changed in retyping:
- the flags are those of OpenRLHF 0.11.2, which this project pins; 0.11.0's importance-sampling flags
  became ``--algo.advantage.is_correction_level`` / ``_mode`` there: ``--algo.advantage.is_correction_enable``
  (0.11.0's default type ``tis``, a token-level clamp) is ``--algo.advantage.is_correction_level token
  --algo.advantage.is_correction_mode clip``, and with ``--algo.advantage.is_correction_type icepop`` (a
  token-level filter) ``--algo.advantage.is_correction_level token --algo.advantage.is_correction_mode mask``;
  the README's pre-0.11 ``--prompt_max_len 1024 --generate_max_len 1024`` is ``--data.max_len 2048
  --rollout.max_new_tokens 1024`` (0.11.2's max_len is prompt + response);
- models, datasets, reward and agent files, output and checkpoint directories are placeholders
  (``{MODEL}``, ``{DATA}``, ...) that the test replaces with small files it creates (``materialize``);
  a wandb key placeholder becomes a dummy string (parsing never logs in).

Each entry says what DPPO does with the command as it stands (``dppo``: None = accepted, with a part of
the start-up line it prints about the command if any; else the flag its refusal names, with a part of
the documented reason), and what ``--dppo.method grpo`` does
(``baseline``: None = accepted with OpenRLHF's own namespace; else the flag it refuses).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from openrlhf_dppo.cli import train_dppo_ray as cli

#: the OpenRLHF release the scripts were read from (OpenRLHF/OpenRLHF, tag v0.11.0; unchanged at the
#: repository's head); the flags are 0.11.2's, see the module docstring
SOURCE_VERSION = "v0.11.0"


@dataclass(frozen=True)
class Example:
    name: str  # the script (examples/scripts/<name>) or README section it comes from
    argv: tuple[str, ...]
    dppo: str | None = None  # None: DPPO accepts it; else the flag its refusal names
    dppo_reason: str = ""  # a part of that refusal's message (the reason documented in README / FLAGS.md)
    baseline: str | None = None  # None: --dppo.method grpo accepts it; else the flag it refuses
    baseline_reason: str = ""
    renamed: tuple[str, ...] = ()  # 0.11.0 flags retyped to 0.11.2's (see the module docstring)
    variant: str = ""  # set when the entry is a documented variant of the script, not the script itself
    dppo_notice: str = ""  # a part of the line DPPO's start-up prints about the command (accepted ones)


GAE = "a critic (GAE) needs every sequence"
TIS = ("--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip")
ICEPOP = ("--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "mask")
RENAMED_TIS = ("--algo.advantage.is_correction_enable",)
RENAMED_ICEPOP = ("--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type")

PPO_RAY_HYBRID_ENGINE = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "8",
    "--reward.num_nodes", "1", "--reward.num_gpus_per_node", "8",
    "--critic.num_nodes", "1", "--critic.num_gpus_per_node", "8",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "8",
    "--vllm.num_engines", "4", "--vllm.tensor_parallel_size", "2",
    "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.5",
    "--actor.model_name_or_path", "{MODEL}", "--reward.model_name_or_path", "{REWARD_MODEL}",
    "--ckpt.output_dir", "{OUT}", "--ckpt.path", "{CKPT}", "--ckpt.save_hf",
    "--train.batch_size", "128", "--rollout.batch_size", "1024", "--rollout.n_samples_per_prompt", "1",
    "--train.max_epochs", "1", "--data.max_len", "2048", "--data.max_samples", "100000",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16",
    "--actor.adam.lr", "5e-7", "--critic.adam.lr", "9e-6", "--algo.kl.init_coef", "0.01",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "context_messages", "--data.apply_chat_template",
    "--reward.normalize_enable", "--actor.gradient_checkpointing_enable", "--ds.packing_samples",
    "--vllm.sync_backend", "nccl", "--vllm.enforce_eager", "--vllm.enable_sleep", "--ds.enable_sleep",
    "--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", "16384",
    *TIS,
)  # fmt: skip

PPO_RAY_SLURM = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "4",
    "--reward.num_nodes", "1", "--reward.num_gpus_per_node", "4",
    "--critic.num_nodes", "1", "--critic.num_gpus_per_node", "4",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "4",
    "--vllm.num_engines", "4", "--vllm.tensor_parallel_size", "2",
    "--train.colocate_critic_reward", "--train.colocate_actor_ref",
    "--actor.model_name_or_path", "{MODEL}", "--reward.model_name_or_path", "{REWARD_MODEL}",
    "--ckpt.output_dir", "{OUT}",
    "--train.micro_batch_size", "8", "--train.batch_size", "128",
    "--rollout.micro_batch_size", "16", "--rollout.batch_size", "1024",
    "--data.max_samples", "100000", "--train.max_epochs", "1", "--data.max_len", "2048",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16",
    "--actor.adam.lr", "5e-7", "--critic.adam.lr", "9e-6", "--algo.kl.init_coef", "0.01",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "context_messages", "--data.apply_chat_template",
    "--reward.normalize_enable", "--ds.adam_offload", "--ds.packing_samples", "--vllm.sync_backend", "nccl",
    "--actor.gradient_checkpointing_enable", "--logger.wandb.key", "{WANDB}",
)  # fmt: skip

PPO_WITH_REWARD_FN = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "2",
    "--critic.num_nodes", "1", "--critic.num_gpus_per_node", "2",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "2",
    "--vllm.num_engines", "2", "--vllm.tensor_parallel_size", "2",
    "--train.colocate_actor_ref",
    "--actor.model_name_or_path", "{MODEL}", "--reward.remote_url", "{REWARD_FN}",
    "--ckpt.output_dir", "{OUT}",
    "--train.micro_batch_size", "8", "--train.batch_size", "128",
    "--rollout.micro_batch_size", "16", "--rollout.batch_size", "1024",
    "--data.max_samples", "100000", "--train.max_epochs", "1", "--data.max_len", "2048",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16",
    "--actor.adam.lr", "5e-7", "--critic.adam.lr", "9e-6", "--algo.kl.init_coef", "0.01",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "context_messages", "--data.apply_chat_template",
    "--reward.normalize_enable", "--ds.packing_samples", "--ds.adam_offload",
    "--ds.attn_implementation", "flash_attention_2", "--actor.gradient_checkpointing_enable",
    "--logger.wandb.key", "{WANDB}",
)  # fmt: skip

DAPO_RAY_HYBRID_ENGINE = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "8",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "8",
    "--vllm.num_engines", "4", "--vllm.tensor_parallel_size", "2",
    "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.6",
    "--algo.kl.init_coef", "1e-3", "--algo.advantage.gamma", "1.0", "--algo.kl.use_loss",
    "--algo.kl.estimator", "k3", "--algo.advantage.estimator", "group_norm",
    "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1",
    "--actor.eps_clip_low_high", "0.2", "0.27",
    "--actor.model_name_or_path", "{MODEL}", "--reward.remote_url", "{REWARD_FN}",
    "--ckpt.output_dir", "{OUT}", "--ckpt.path", "{CKPT}", "--ckpt.save_steps", "20", "--ckpt.save_hf",
    "--train.micro_batch_size", "8", "--train.batch_size", "128",
    "--rollout.micro_batch_size", "16", "--rollout.batch_size", "128", "--rollout.n_samples_per_prompt", "8",
    "--train.max_epochs", "1", "--data.max_len", "2048", "--data.max_samples", "20000",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16", "--actor.adam.lr", "5e-7",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "context_messages", "--data.apply_chat_template",
    "--actor.gradient_checkpointing_enable", "--ds.packing_samples", "--vllm.sync_backend", "nccl",
    "--vllm.enforce_eager", "--vllm.enable_sleep", "--ds.enable_sleep",
    *TIS,
)  # fmt: skip

PRORLV2_MATH_HYBRID_ENGINE = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "8",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "8",
    "--vllm.num_engines", "8", "--vllm.tensor_parallel_size", "1",
    "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.75",
    "--algo.kl.init_coef", "1e-4", "--algo.advantage.gamma", "1.0", "--algo.kl.use_loss",
    "--algo.kl.estimator", "k2", "--algo.advantage.estimator", "reinforce_baseline",
    "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1",
    "--actor.eps_clip_low_high", "0.2", "0.27",
    "--actor.model_name_or_path", "{MODEL}", "--reward.remote_url", "{REWARD_FN}",
    "--ckpt.output_dir", "{OUT}", "--ckpt.path", "{CKPT}", "--ckpt.save_steps", "5", "--ckpt.save_hf",
    "--train.batch_size", "1024", "--rollout.batch_size", "512", "--rollout.n_samples_per_prompt", "16",
    "--train.dynamic_batch_enable", "--train.num_episodes", "100",
    "--data.max_len", "9216", "--rollout.max_new_tokens", "8192",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16", "--actor.adam.lr", "1e-6",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "prompt", "--data.label_key", "label",
    "--eval.dataset", "{EVAL_DATA}", "--eval.steps", "5", "--eval.temperature", "1.0",
    "--eval.n_samples_per_prompt", "4",
    "--data.apply_chat_template", "--actor.gradient_checkpointing_enable", "--ds.packing_samples",
    "--vllm.sync_backend", "nccl", "--vllm.enforce_eager", "--vllm.enable_sleep", "--ds.enable_sleep",
    *ICEPOP, "--algo.advantage.is_correction_threshold", "0.5", "5.0",
    "--train.max_tokens_per_gpu", "32768", "--reward.stop_properly_penalty_coef", "0.0",
)  # fmt: skip

_REINFORCE_BASELINE_CKPT = (
    "--actor.model_name_or_path", "{MODEL}", "--ckpt.load_enable",
    "--ckpt.output_dir", "{OUT}", "--ckpt.path", "{CKPT}", "--ckpt.save_hf", "--ckpt.max_num", "3",
    "--ckpt.save_steps", "10",
)  # fmt: skip
_REINFORCE_BASELINE_ROLLOUT = (
    "--train.agent_func_path", "{AGENT_FN}",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "prompt", "--data.label_key", "label",
    "--data.max_len", "74240", "--rollout.max_new_tokens", "64000", "--data.apply_chat_template",
    "--ds.packing_samples",
    "--rollout.batch_size", "128", "--rollout.n_samples_per_prompt", "8", "--train.batch_size", "1024",
    "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.0", "1.0",
    "--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", "16192", "--rollout.max_tokens_per_gpu", "32768",
    "--train.micro_batch_size", "1", "--rollout.micro_batch_size", "8", "--data.max_samples", "128000",
    "--train.max_epochs", "1", "--train.num_episodes", "1",
)  # fmt: skip
_REINFORCE_BASELINE_ENGINES = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "4",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "4",
    "--vllm.num_engines", "2", "--vllm.tensor_parallel_size", "2",
)  # fmt: skip
_REINFORCE_BASELINE_DEEPSPEED = (
    "--ds.zero_stage", "3", "--actor.gradient_checkpointing_enable",
    "--ds.ring_attn_size", "2", "--ds.ring_attn_head_stride", "2", "--ds.param_dtype", "bf16",
)  # fmt: skip


def _reinforce_baseline_optimizer(estimator: str) -> tuple[str, ...]:
    return (
        "--algo.advantage.estimator", estimator, "--actor.adam.lr", "5e-7", "--actor.entropy_coef", "0.0",
        "--algo.kl.init_coef", "1e-5", "--algo.kl.use_loss", "--algo.kl.estimator", "k2", *ICEPOP,
    )  # fmt: skip


_REINFORCE_BASELINE_LOG = (
    "--logger.tensorboard_dir", "{LOGS}", "--logger.logging_steps", "1", "--eval.steps", "-1",
)  # fmt: skip


def _reinforce_baseline_hybrid_engine(estimator: str) -> tuple[str, ...]:
    return (
        *_REINFORCE_BASELINE_CKPT,
        *_REINFORCE_BASELINE_ROLLOUT,
        *_REINFORCE_BASELINE_ENGINES,
        "--vllm.gpu_memory_utilization", "0.7", "--train.colocate_all", "--ds.enable_sleep",
        "--vllm.sync_backend", "nccl", "--vllm.enforce_eager",
        *_REINFORCE_BASELINE_DEEPSPEED,
        *_reinforce_baseline_optimizer(estimator),
        *_REINFORCE_BASELINE_LOG,
    )  # fmt: skip


REINFORCE_BASELINE_RAY_AGENT_ASYNC = (
    *_REINFORCE_BASELINE_CKPT,
    *_REINFORCE_BASELINE_ROLLOUT,
    "--train.async_enable", "--train.partial_rollout_enable",
    *_REINFORCE_BASELINE_ENGINES,
    "--vllm.gpu_memory_utilization", "0.95", "--train.colocate_all", "--ds.enable_sleep",
    "--vllm.sync_backend", "nccl", "--vllm.enforce_eager",
    *_REINFORCE_BASELINE_DEEPSPEED,
    *_reinforce_baseline_optimizer("reinforce_baseline"),
    *_REINFORCE_BASELINE_LOG,
)  # fmt: skip

VLM_MATH_HYBRID_ENGINE = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "4",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "4",
    "--vllm.num_engines", "4", "--vllm.tensor_parallel_size", "1",
    "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.7",
    "--algo.kl.init_coef", "0", "--algo.advantage.gamma", "1.0", "--algo.kl.use_loss",
    "--algo.kl.estimator", "k2", "--algo.advantage.estimator", "reinforce_baseline",
    "--actor.model_name_or_path", "{MODEL}", "--reward.remote_url", "{REWARD_FN}",
    "--ckpt.output_dir", "{OUT}", "--ckpt.path", "{CKPT}", "--ckpt.save_hf", "--ckpt.save_steps", "5",
    "--eval.steps", "-1",
    "--train.micro_batch_size", "1", "--rollout.micro_batch_size", "1",
    "--train.batch_size", "1024", "--rollout.batch_size", "128", "--rollout.n_samples_per_prompt", "8",
    "--train.num_episodes", "100", "--data.max_len", "4096", "--rollout.max_new_tokens", "2048",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16", "--actor.adam.lr", "2e-6",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "prompt", "--data.label_key", "label",
    "--data.image_key", "images", "--data.max_images_per_prompt", "1", "--actor.freeze_visual_encoder",
    "--data.apply_chat_template", "--actor.gradient_checkpointing_enable", "--ds.attn_implementation", "eager",
    "--vllm.sync_backend", "nccl", "--vllm.enforce_eager", "--vllm.enable_sleep", "--ds.enable_sleep",
)  # fmt: skip

README_RL_TRAINING = (
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "8",
    "--reward.num_nodes", "1", "--reward.num_gpus_per_node", "8",
    "--critic.num_nodes", "1", "--critic.num_gpus_per_node", "8",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "8",
    "--vllm.num_engines", "4", "--vllm.tensor_parallel_size", "2",
    "--train.colocate_all", "--vllm.gpu_memory_utilization", "0.5",
    "--actor.model_name_or_path", "{MODEL}", "--reward.model_name_or_path", "{REWARD_MODEL}",
    "--ckpt.output_dir", "{OUT}", "--ckpt.path", "{CKPT}", "--ckpt.save_hf",
    "--train.batch_size", "128", "--rollout.batch_size", "1024", "--train.dynamic_batch_enable",
    "--rollout.n_samples_per_prompt", "1", "--train.max_epochs", "1",
    "--data.max_len", "2048", "--data.max_samples", "100000", "--rollout.max_new_tokens", "1024",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16",
    "--actor.adam.lr", "5e-7", "--critic.adam.lr", "9e-6", "--algo.kl.init_coef", "0.01",
    "--data.prompt_dataset", "{DATA}", "--data.input_key", "context_messages", "--data.apply_chat_template",
    "--reward.normalize_enable", "--actor.gradient_checkpointing_enable", "--ds.packing_samples",
    "--vllm.sync_backend", "nccl", "--vllm.enforce_eager", "--vllm.enable_sleep", "--ds.enable_sleep",
    "--logger.wandb.key", "{WANDB}",
)  # fmt: skip

#: --data.max_len 74,240 over --train.max_tokens_per_gpu 16,192 x ring 2: accepted, a longer rollout alone
MAX_LEN = "--data.max_len 74240 exceeds a micro-batch's 32384 tokens"

EXAMPLES = (
    Example("train_ppo_ray_hybrid_engine.sh", PPO_RAY_HYBRID_ENGINE, "--algo.advantage.estimator", GAE,
            renamed=RENAMED_TIS),
    Example("train_ppo_ray_slurm.sh", PPO_RAY_SLURM, "--algo.advantage.estimator", GAE),
    Example("train_ppo_with_reward_fn.sh", PPO_WITH_REWARD_FN, "--algo.advantage.estimator", GAE),
    Example("train_dapo_ray_hybrid_engine.sh", DAPO_RAY_HYBRID_ENGINE, renamed=RENAMED_TIS),
    Example("train_prorlv2_math_hybrid_engine.sh", PRORLV2_MATH_HYBRID_ENGINE, renamed=RENAMED_ICEPOP),
    Example("train_reinforce_baseline_hybrid_engine.sh", _reinforce_baseline_hybrid_engine("reinforce_baseline"),
            renamed=RENAMED_ICEPOP, dppo_notice=MAX_LEN),
    Example("train_reinforce_baseline_hybrid_engine.sh", _reinforce_baseline_hybrid_engine("group_norm"),
            renamed=RENAMED_ICEPOP, dppo_notice=MAX_LEN,
            variant="GRPO: --algo.advantage.estimator group_norm, as the README lists for this script"),
    Example("train_reinforce_baseline_ray_agent_async.sh", REINFORCE_BASELINE_RAY_AGENT_ASYNC,
            renamed=RENAMED_ICEPOP),
    Example("train_vlm_math_hybrid_engine.sh", VLM_MATH_HYBRID_ENGINE, "--data.max_images_per_prompt",
            "does not support for vision-language models"),
    Example("README.md (RL Training: PPO/REINFORCE++ with Ray and vLLM)", README_RL_TRAINING,
            "--algo.advantage.estimator", GAE, renamed=("--prompt_max_len", "--generate_max_len")),
)  # fmt: skip


def example_id(example: Example) -> str:
    return example.name.split(" ")[0].removesuffix(".sh") + ("-grpo" if example.variant else "")


def materialize(example: Example, root: Path) -> list[str]:
    """``example.argv`` with its placeholders replaced by small files and directories under ``root``: the
    dataset records carry the keys the command names, the reward and agent files OpenRLHF's contract."""
    argv = list(example.argv)

    def value(flag: str, default: str | None = None) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else default

    keys = [value("--data.input_key", "input"), value("--data.label_key")]
    record = "{" + ", ".join(f'"{k}": "1+1"' for k in keys if k) + "}\n"
    for name in ("model", "reward_model"):
        (root / name).mkdir(exist_ok=True)
    (root / "prompts.jsonl").write_text(record)
    (root / "eval.jsonl").write_text(record)
    (root / "reward_func.py").write_text("def reward_func(queries, prompts, labels):\n    return None\n")
    (root / "agent_func.py").write_text("class AgentExecutor:\n    pass\n")
    places = {
        "{MODEL}": root / "model", "{REWARD_MODEL}": root / "reward_model", "{DATA}": root / "prompts.jsonl",
        "{EVAL_DATA}": root / "eval.jsonl", "{REWARD_FN}": root / "reward_func.py",
        "{AGENT_FN}": root / "agent_func.py", "{OUT}": root / "out", "{CKPT}": root / "ckpt",
        "{LOGS}": root / "runs", "{WANDB}": "dummy-wandb-key",
    }  # fmt: skip
    return [str(places[a]) if a in places else a for a in argv]


class _Captured(Exception):
    def __init__(self, namespace):
        super().__init__("stopped before train()")
        self.namespace = namespace


def openrlhf_parse(argv: list[str]) -> SimpleNamespace:
    """The namespace OpenRLHF 0.11.2's own main block makes of ``argv``: its parser's ``parse_args()`` on
    ``sys.argv`` (set for the call), then its validation; the final ``train(args)`` only captures."""
    origin, module = cli._load_openrlhf_main()

    def stop(args):
        raise _Captured(args)

    saved = sys.argv
    sys.argv = ["train_ppo_ray.py", *argv]
    namespace = {"__name__": "__main__", "__file__": origin,
                 cli.PARSE_HOOK: lambda parser: parser.parse_args(), cli.TRAIN_HOOK: stop}  # fmt: skip
    try:
        exec(compile(module, origin, "exec"), namespace)
    except _Captured as captured:
        return captured.namespace
    finally:
        sys.argv = saved
    raise AssertionError("OpenRLHF's main block ended without calling train(args)")


def flat(ns: SimpleNamespace, prefix: str = "") -> dict:
    """A nested (hierarchized) namespace as {"group.flag": value}."""
    out = {}
    for key, value in vars(ns).items():
        if isinstance(value, SimpleNamespace):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
