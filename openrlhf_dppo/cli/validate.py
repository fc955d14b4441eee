"""Bad input stops here, before OpenRLHF's own validation and long before Ray starts.

``validate(flags, check_inputs=...)`` runs on the parsed, still flat namespace (``{"train.batch_size":
128, "dppo.q_min": 0.1, ...}``) inside the parse hook of ``train_dppo_ray``. Every refusal is a
``FlagError`` that names the flag (and the file, when one is missing) and says what was expected. In
this order:

1. DPPO's own flags (``DPPOConfig``, ``RunOptions``): the field's error names ``--dppo.<field>``.
2. What DPPO needs from the rest of the command (only with DPPO on): vLLM engines, rewards on the
   rollouts (``--reward.remote_url`` or ``--train.agent_func_path``), a group advantage estimator, ...
3. The conditions OpenRLHF 0.11.2 asserts (``check_host_asserts``: in its validation, or later in
   ``train`` after Ray started), so that they fail here with the flag's name instead of a bare
   AssertionError; then budgets and sequence limits (both arms where the host needs them too). A
   ``--data.max_len`` over a micro-batch's capacity (``core.micro_batch_capacity``, the packer's) is no
   refusal: ``limit_notices`` gives the start-up line (a longer rollout is a micro-batch of its own).
4. The inputs named on the command line exist (``check_inputs``; both arms): model, datasets, reward
   file or URL, agent file; and what ``cli.inputs`` checks on them (the reward or agent file imports and
   has OpenRLHF's function or class, a reward URL answers, the dataset's first record has the keys, the
   output directories are writable). Rule for names that may be Hugging Face Hub ids (models, datasets):
   a name that exists on this machine is used as it is; a name that only a local path can be (it starts
   with ``/``, ``./``, ``../`` or ``~``, has more than one ``/``, or -- datasets -- ends in a data-file
   or ``.py`` extension, which OpenRLHF always loads from disk) must exist; any other name is taken
   as a Hub id (``name`` or ``namespace/name``) and left to the download. A name that is neither a
   local path nor a valid Hub id is refused.

Imports no host module (OpenRLHF, Ray, DeepSpeed, vLLM).
"""

from __future__ import annotations

import glob
import os
import re

from openrlhf_dppo.cli import inputs
from openrlhf_dppo.cli.flags import build_options, dppo_values_from_flags
from openrlhf_dppo.cli.peers import cppo_refusal, greso_refusal
from openrlhf_dppo.core.config import DPPOConfigError
from openrlhf_dppo.core.packing import micro_batch_capacity

#: estimators whose advantages DPPO computes on the full groups (core.group_advantages); REINFORCE++-baseline's
#: batch whitening is then estimated from the kept completions (core.token_whitening)
GROUP_ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")
#: extensions OpenRLHF's blending_datasets always loads as local files
DATA_FILE_EXTENSIONS = (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".py")
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^{_HUB_PART}(?:/{_HUB_PART})?$")


class FlagError(ValueError):
    """A flag value (or the file it names) the run cannot start with. ``flag``: e.g. ``--dppo.q_min``."""

    def __init__(self, flag: str, message: str) -> None:
        self.flag, self.message = flag, message
        super().__init__(f"{flag}: {message}")


def validate(flags: dict, check_inputs: bool = True):
    """Check a parsed command line; returns (DPPOConfig, RunOptions). Raises FlagError.

    flags: the flat namespace as a dict (``vars(parser.parse_args(argv))``), before OpenRLHF's
    validation has touched it.  check_inputs: look for the named files on this machine.
    """
    try:
        cfg, run = build_options(dppo_values_from_flags(flags))
    except DPPOConfigError as err:
        raise FlagError(f"--dppo.{err.field}", f"{err.value!r}: {err.reason}") from err
    # DPPO's maker and packed plan, CPPO's too (grpo, greso: OpenRLHF's maker and training step)
    dppo = cfg.method in ("dppo", "cppo")
    if dppo:
        check_dppo_requirements(flags)
    if cfg.method == "cppo" and (refusal := cppo_refusal(flags, cfg.completion_prune_rate)) is not None:
        raise FlagError(*refusal)
    if cfg.method == "greso" and (refusal := greso_refusal(flags)) is not None:
        raise FlagError(*refusal)
    check_host_asserts(flags)  # first: it refuses a ring or tensor-parallel size below 1 by name
    check_limits(flags, dppo=dppo)
    check_steps_per_batch(flags, dppo=dppo, short_batch=cfg.short_batch)
    if check_inputs:
        check_input_files(flags)
        check_output_dirs(flags)
    return cfg, run


def check_dppo_requirements(flags: dict) -> None:
    """What a DPPO run needs from OpenRLHF's flags, with the reason."""
    engines = flags["vllm.num_engines"]
    if engines is None or engines < 1:
        raise FlagError(
            "--vllm.num_engines",
            f"DPPO needs vLLM engines (got {engines}; e.g. --vllm.num_engines 1): it prunes prompts before "
            "vLLM generates them, and it trains through OpenRLHF's packed micro-batches, which OpenRLHF "
            "runs only with vLLM.",
        )
    est = flags["algo.advantage.estimator"]
    if est == "gae":
        raise FlagError(
            "--algo.advantage.estimator",
            "gae: DPPO prunes whole completions by their group advantage and skips their forward passes; a "
            "critic (GAE) needs every sequence. Use group_norm, dr_grpo, rloo or reinforce_baseline.",
        )
    if est not in GROUP_ESTIMATORS:
        raise FlagError(
            "--algo.advantage.estimator",
            f"{est}: DPPO computes advantages on the full groups (core.group_advantages) and needs a group "
            f"estimator: {', '.join(GROUP_ESTIMATORS)}.",
        )
    if not flags["reward.remote_url"] and not flags["train.agent_func_path"]:
        raise FlagError(
            "--reward.remote_url",
            "DPPO needs the rewards on the rollouts (to compute advantages before the forward passes it "
            "skips). Pass --reward.remote_url <reward function .py file or http(s) URL> or "
            "--train.agent_func_path <agent .py file>; a reward model (--reward.model_name_or_path) scores "
            "too late.",
        )
    if flags["rollout.n_samples_per_prompt"] < 2:
        raise FlagError("--rollout.n_samples_per_prompt", "DPPO needs groups of at least 2 completions")
    if (flags.get("data.max_images_per_prompt") or 0) > 0:
        raise FlagError(
            "--data.max_images_per_prompt",
            "DPPO trains through packed micro-batches, which OpenRLHF 0.11.2 does not support for "
            "vision-language models.",
        )
    gen = flags["rollout.vllm_generate_batch_size"]
    if gen is not None and gen != flags["rollout.batch_size"]:
        raise FlagError(
            "--rollout.vllm_generate_batch_size",
            "DPPO prunes each step's drawn prompt batch; it must equal --rollout.batch_size.",
        )
    coef = flags["actor.aux_loss_coef"]
    if coef and coef > 0:
        raise FlagError(
            "--actor.aux_loss_coef",
            f"{coef}: the MoE load-balancing loss is one term per micro-batch (router statistics over all its "
            "tokens), not a sum over sequences, so it cannot carry DPPO's per-sequence weights 1/(q p) and "
            "the pruned objective would be biased. Use --actor.aux_loss_coef 0 with DPPO (or --dppo.method "
            "grpo for the GRPO baseline).",
        )


def check_limits(flags: dict, dppo: bool) -> None:
    """Token budgets and sequence limits. Packed micro-batches (DPPO, or --train.dynamic_batch_enable)
    need positive budgets and vLLM engines."""
    max_len, new = flags["data.max_len"], flags["rollout.max_new_tokens"]
    if max_len < 2:
        raise FlagError(
            "--data.max_len", f"{max_len}: a sequence needs at least one prompt and one response token"
        )
    if new is not None and new < 1:
        raise FlagError(
            "--rollout.max_new_tokens", f"{new}: must be >= 1 (or unset: max_len - prompt length)"
        )
    if new is not None and new >= max_len:
        raise FlagError(
            "--rollout.max_new_tokens",
            f"{new} leaves no room for the prompt within --data.max_len {max_len} (OpenRLHF cuts each prompt "
            "to max_len - max_new_tokens tokens); lower it or raise --data.max_len.",
        )
    if not (dppo or flags["train.dynamic_batch_enable"]):
        return
    engines = flags["vllm.num_engines"]
    if engines is None or engines < 1:
        raise FlagError(
            "--vllm.num_engines",
            f"got {engines}: --train.dynamic_batch_enable (packed micro-batches) runs only with vLLM engines "
            "in OpenRLHF 0.11.2.",
        )
    for flag in ("train.max_tokens_per_gpu", "rollout.max_tokens_per_gpu"):
        budget = flags[flag]
        if budget is not None and budget < 1:
            raise FlagError(f"--{flag}", f"{budget}: a token budget per GPU must be >= 1")


def limit_notices(flags: dict, dppo: bool) -> list[str]:
    """What the start-up prints about the sequence limits (DPPO only): a rollout that can be longer than a
    micro-batch's capacity trains (and is forwarded) in a micro-batch of its own, as OpenRLHF runs it."""
    max_len = flags["data.max_len"]
    budget, ring, tp = (
        flags[f] for f in ("train.max_tokens_per_gpu", "ds.ring_attn_size", "ds.tensor_parallel_size")
    )
    capacity = micro_batch_capacity(budget, ring, tp)
    if not dppo or max_len <= capacity:
        return []
    return [
        f"--data.max_len {max_len} exceeds a micro-batch's {capacity} tokens (--train.max_tokens_per_gpu "
        f"{budget} x --ds.ring_attn_size {ring} x --ds.tensor_parallel_size {tp}): a rollout longer than that "
        "trains in a micro-batch of its own, over the budget (and, past --rollout.max_tokens_per_gpu x ring x "
        "TP, is forwarded in a batch of its own), as OpenRLHF runs it: never split or truncated"
    ]


def check_steps_per_batch(flags: dict, dppo: bool, short_batch: str) -> None:
    """With packed micro-batches a rollout batch trains its whole --train.batch_size batches only
    (OpenRLHF's rule, ``--dppo.short_batch drop``): a full batch smaller than one would never train."""
    if not (dppo or flags["train.dynamic_batch_enable"]) or short_batch == "train":
        return
    batch, n, train = (
        flags[f] for f in ("rollout.batch_size", "rollout.n_samples_per_prompt", "train.batch_size")
    )
    if batch * n < train:
        raise FlagError(
            "--train.batch_size",
            f"{train} exceeds a rollout batch of --rollout.batch_size {batch} x --rollout.n_samples_per_prompt "
            f"{n} = {batch * n} rollouts: with packed micro-batches a rollout batch trains only its whole train "
            "batches, so no step would ever train. Lower --train.batch_size to at most "
            f"{batch * n}, or pass --dppo.short_batch train (a batch smaller than one train batch is one step).",
        )


def check_host_asserts(flags: dict) -> None:
    """What OpenRLHF 0.11.2 asserts about the command line (``openrlhf/cli/train_ppo_ray.py``), refused
    here with the flag's name: its validation's asserts raise a bare AssertionError, and those in
    ``train`` come after Ray has started."""
    low, high = flags["algo.dynamic_filtering_range"]
    if not low < high:
        raise FlagError(
            "--algo.dynamic_filtering_range",
            f"{low} {high}: expected LOW HIGH with LOW < HIGH (groups whose mean reward lies outside it are "
            "filtered out)",
        )
    for flag in ("rollout.micro_batch_size", "ds.ring_attn_size", "ds.tensor_parallel_size"):
        if flags[flag] < 1:
            raise FlagError(f"--{flag}", f"{flags[flag]}: must be >= 1")
    actors = flags["actor.num_nodes"] * flags["actor.num_gpus_per_node"]
    processes = actors // flags["ds.ring_attn_size"] // flags["ds.tensor_parallel_size"]
    n, batch, micro = (
        flags[f"rollout.{k}"] for k in ("n_samples_per_prompt", "batch_size", "micro_batch_size")
    )
    if n * batch // micro < processes:
        raise FlagError(
            "--rollout.micro_batch_size",
            f"{micro}: --rollout.batch_size {batch} x --rollout.n_samples_per_prompt {n} makes "
            f"{n * batch // micro} micro-batches of {micro}, fewer than the {processes} actor processes "
            "(--actor.num_nodes x --actor.num_gpus_per_node / --ds.ring_attn_size / --ds.tensor_parallel_size); "
            "each needs one. Lower it or raise --rollout.batch_size.",
        )
    colocated = flags["train.colocate_actor_ref"] or flags["train.colocate_all"]
    ref_like_actor = (flags["ref.num_nodes"], flags["ref.num_gpus_per_node"]) == (
        flags["actor.num_nodes"],
        flags["actor.num_gpus_per_node"],
    )
    if colocated and flags["algo.kl.init_coef"] > 0 and not ref_like_actor:
        raise FlagError(
            "--ref.num_gpus_per_node",
            "the reference model shares the actor's GPUs (--train.colocate_actor_ref or --train.colocate_all): "
            "--ref.num_nodes and --ref.num_gpus_per_node must equal --actor.num_nodes and "
            "--actor.num_gpus_per_node",
        )
    asynchronous = flags["train.async_enable"]
    if flags["train.partial_rollout_enable"] and not asynchronous:
        raise FlagError("--train.partial_rollout_enable", "needs --train.async_enable (OpenRLHF asserts it)")
    if asynchronous and flags["vllm.enable_sleep"] and flags["train.colocate_all"]:
        raise FlagError(
            "--vllm.enable_sleep",
            "not with --train.async_enable (OpenRLHF 0.11.2 asserts it): the generator keeps the engines "
            "busy while the actor trains, so they cannot sleep",
        )
    gen = flags["rollout.vllm_generate_batch_size"]
    if gen is not None and gen > flags["rollout.batch_size"] and not asynchronous:
        raise FlagError(
            "--rollout.vllm_generate_batch_size",
            f"{gen} > --rollout.batch_size {flags['rollout.batch_size']} needs --train.async_enable (OpenRLHF "
            "0.11.2 asserts it): the extra rollouts wait for later steps in the generator's buffer",
        )
    engines, tp = flags["vllm.num_engines"] or 0, flags["vllm.tensor_parallel_size"]
    colocated_all = flags["train.colocate_all"] and not flags["train.async_enable"]
    if engines > 0 and colocated_all and engines * tp != actors:
        raise FlagError(
            "--vllm.num_engines",
            f"{engines} x --vllm.tensor_parallel_size {tp} GPUs for vLLM, but the actor has {actors} "
            "(--train.colocate_all puts every model on the same GPUs): they must be equal",
        )


def check_output_dirs(flags: dict) -> None:
    """The directories the run writes in can be created and written (``cli.inputs``)."""
    dirs = {"--ckpt.output_dir": flags["ckpt.output_dir"], "--dppo.run_dir": flags.get("dppo.run_dir")}
    if (flags["ckpt.save_steps"] or 0) > 0:
        dirs["--ckpt.path"] = flags["ckpt.path"]
    for flag, path in dirs.items():
        if path:
            try:
                inputs.check_writable_dir(path)
            except inputs.InputError as err:
                raise FlagError(flag, str(err)) from None


def check_input_files(flags: dict) -> None:
    """The model, datasets, reward function and agent named on the command line exist (rule: module doc)."""
    model = flags["actor.model_name_or_path"]
    if not model:
        raise FlagError(
            "--actor.model_name_or_path", "required: a local model directory or a Hugging Face Hub id"
        )
    _check_model("--actor.model_name_or_path", model)
    if flags["algo.advantage.estimator"] == "gae" and flags["critic.model_name_or_path"]:
        _check_model("--critic.model_name_or_path", flags["critic.model_name_or_path"])
    for name in (flags["reward.model_name_or_path"] or "").split(","):
        if name.strip():
            _check_model("--reward.model_name_or_path", name.strip())
    if not flags["data.prompt_dataset"]:
        raise FlagError(
            "--data.prompt_dataset", "required: a local data file or directory, or a Hugging Face Hub id"
        )
    keys = {"--data.input_key": flags["data.input_key"], "--data.label_key": flags["data.label_key"]}
    _check_datasets("--data.prompt_dataset", flags["data.prompt_dataset"], keys)
    if flags["eval.dataset"]:
        _check_datasets("--eval.dataset", flags["eval.dataset"], keys)
    agent = flags["train.agent_func_path"]
    if agent:  # OpenRLHF then ignores --reward.remote_url: the agent returns the rewards
        if not agent.endswith(".py"):
            raise FlagError(
                "--train.agent_func_path", f"{agent}: expected a Python file (.py) with an AgentExecutor"
            )
        if not os.path.isfile(agent):
            raise FlagError("--train.agent_func_path", f"{agent}: no such file")
        _check_input("--train.agent_func_path", inputs.check_python_file, agent, "agent")
    elif flags["reward.remote_url"]:
        _check_reward_urls(flags["reward.remote_url"])


def is_hub_id(name: str) -> bool:
    """``name`` or ``namespace/name`` as the Hugging Face Hub spells repository ids."""
    return bool(_HUB_ID.match(name)) and "--" not in name and ".." not in name


def _only_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or "\\" in name


def _exists(path: str) -> bool:
    return os.path.exists(path) or os.path.exists(os.path.expanduser(path))


def _check_model(flag: str, name: str) -> None:
    if _exists(name):
        return
    if _only_local(name) or not is_hub_id(name):
        raise FlagError(
            flag, f"{name}: no such local path, and not a Hugging Face Hub id (name or namespace/name)"
        )


def _check_input(flag: str, check, *args) -> None:
    try:
        check(*args)
    except inputs.InputError as err:
        raise FlagError(flag, str(err)) from None


def _check_datasets(flag: str, value: str, keys: dict[str, str | None]) -> None:
    """OpenRLHF's form: comma-separated entries, each ``path_or_id[@data_dir]``. keys: {flag: key} the
    first record of a local data file must have (``cli.inputs.missing_key``)."""
    for entry in value.split(","):
        name = entry.split("@")[0].strip()
        if not name:
            raise FlagError(flag, f"{value!r} has an empty dataset entry")
        if "://" not in name and os.path.isfile(os.path.expanduser(name)):
            missing = inputs.missing_key(os.path.expanduser(name), keys)
            if missing is not None:
                raise FlagError(*missing)
        if "://" in name or _exists(name):
            continue
        ext = os.path.splitext(name)[1].lower()
        if ext in DATA_FILE_EXTENSIONS:
            if any(c in name for c in "*?[") and glob.glob(os.path.expanduser(name)):
                continue
            raise FlagError(
                flag, f"{name}: no such file (OpenRLHF loads a {ext} dataset from the local disk)"
            )
        if _only_local(name) or not is_hub_id(name):
            raise FlagError(flag, f"{name}: no such local path, and not a Hugging Face Hub dataset id")


def _check_reward_urls(value: str) -> None:
    """OpenRLHF's form: comma-separated endpoints; a first entry ending in .py is a reward-function file."""
    for i, entry in enumerate(e.strip() for e in value.split(",")):
        if entry.startswith(("http://", "https://")):
            _check_input("--reward.remote_url", inputs.check_url_answers, entry)
            continue
        if entry.endswith(".py"):
            if i > 0:
                raise FlagError(
                    "--reward.remote_url",
                    f"{entry}: a reward-function file must be the first (only) entry; OpenRLHF sends the other "
                    "entries HTTP requests",
                )
            if not os.path.isfile(entry):
                raise FlagError("--reward.remote_url", f"{entry}: no such reward-function file")
            _check_input("--reward.remote_url", inputs.check_python_file, entry, "reward")
            continue
        raise FlagError(
            "--reward.remote_url",
            f"{entry!r}: expected a reward-function .py file or an http:// or https:// URL",
        )
