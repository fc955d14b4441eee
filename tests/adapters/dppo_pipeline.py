"""The adapters wired to the stand-ins (``dppo_stand_ins``): an experience maker, a bare trainer and a
controller step (samples generator -> experience maker -> dispatch plan -> per-rank replay buffers)
without Ray. Shared by the adapter tests."""

import copy
from types import SimpleNamespace

import torch
from dppo_stand_ins import (
    GENERATE_KW,
    StandInGroup,
    StandInTokenizer,
    base_argv,
    generator_for,
    logprob_fn,
    make_args,
    solved_every_4th,
)
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

from openrlhf_dppo.adapters.actor import DPPOReplayBuffer, micro_batch_counts, step_counts
from openrlhf_dppo.adapters.experience_maker import (
    CountingExperienceMaker,
    CPPOExperienceMaker,
    DPPOExperienceMaker,
)
from openrlhf_dppo.adapters.samples_generator import DPPOSamplesGenerator
from openrlhf_dppo.adapters.step import (
    DrawRecord,
    PromptDraw,
    Rollouts,
    StepContext,
    scheduler_steps,
    short_batch_steps,
    unwrap_actor_class,
)
from openrlhf_dppo.adapters.trainer import DPPOTrainer
from openrlhf_dppo.core import PromptHistory, PromptRateControl
from openrlhf_dppo.run_dir import RunDir

Trainer = unwrap_actor_class(DPPOTrainer)

# ---- the experience maker ---------------------------------------------------------------------------

ACTOR = logprob_fn(0.01, 0.05, 5)
REF = logprob_fn(0.02, 0.07, 3)


_ARGS = {}


def args_for(dp=1, kl="none", extra=()):
    key = (dp, kl, tuple(extra))
    if key not in _ARGS:
        argv = base_argv(dp=dp)
        if kl != "none":
            argv = [
                a if a != "0" or argv[i - 1] != "--algo.kl.init_coef" else "0.05" for i, a in enumerate(argv)
            ]
        if kl == "loss":
            argv += ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"]
        _ARGS[key] = make_args(argv + list(extra))
    return copy.deepcopy(_ARGS[key])


def tag(samples, group, q=None, index=None):
    """``Rollouts`` of ``samples`` (whole groups) whose context records group j's prompt as dataset
    index index[j] (default j), drawn with q[j] (default 1), as the samples generator would."""
    ctx = StepContext(step=0)
    for j in range(len(samples) // group):
        draw = PromptDraw(j if index is None else index[j], 1.0 if q is None else float(q[j]))
        ctx.prompts[samples[j * group].prompts[0]] = draw
    return Rollouts(samples, ctx)


def groups(args):
    ref = StandInGroup(REF, 1) if args.algo.kl.init_coef > 0 else None
    return StandInGroup(ACTOR, 1), ref


def dppo_maker(args, cfg):
    actor, ref = groups(args)
    strategy = SimpleNamespace(args=args)
    kl = FixedKLController(args.algo.kl.init_coef)
    return DPPOExperienceMaker(
        actor, None, None, ref, kl, strategy, StandInTokenizer(), dppo=cfg, history=PromptHistory(16)
    )


def grpo_maker(args, host=CountingExperienceMaker):
    """The GRPO arm's experience maker (or, with host=RemoteExperienceMaker, OpenRLHF's own)."""
    actor, ref = groups(args)
    kl = FixedKLController(args.algo.kl.init_coef)
    return host(actor, None, None, ref, kl, SimpleNamespace(args=args), StandInTokenizer())


def make(maker, rollouts, step=0, drawn=None, filtered=()):
    """One step through the maker: (experiences, the StepContext it filled). rollouts: from ``tag``;
    drawn: the prompts the generator drew (None: no draw record, as with dynamic filtering's HT count);
    filtered: ``tag``-ged groups dynamic filtering dropped."""
    ctx = rollouts.ctx
    ctx.step, ctx.draw, ctx.filtered = (
        step,
        None if drawn is None else DrawRecord(drawn=drawn),
        list(filtered),
    )
    ctx.prompts.update(getattr(filtered, "ctx", StepContext(0)).prompts)
    return maker.make_experience_batch(rollouts), ctx


# ---- the trainer ------------------------------------------------------------------------------------


class CheckpointGroup:
    """Actor group stand-in that keeps what ``save_checkpoint`` is given, as DeepSpeed would."""

    def __init__(self, states=None):
        self.saved = []
        self.states = states

    def async_run_method(self, method_name, **kwargs):
        if method_name == "save_checkpoint":
            self.saved.append(kwargs)
        if method_name == "get_checkpoint_states":
            return [self.states]
        return [None]


def bare_trainer(args, cfg, run_dir, group):
    """A trainer object with the attributes BasePPOTrainer's hooks use (its __init__ needs Ray and a model)."""
    t = object.__new__(Trainer)
    t.args, t.strategy, t.dppo = args, SimpleNamespace(args=args), cfg
    t.history = PromptHistory(10)
    gen = object.__new__(DPPOSamplesGenerator)  # the draw state only (its __init__ needs a dataloader)
    gen.dppo, gen.history, gen.draws, gen.rate_control = cfg, t.history, 0, PromptRateControl.from_config(cfg)
    t.samples_generator = gen
    t.run_dir = run_dir
    t.actor_model_group, t.critic_model_group = group, None
    t.wandb_logger = t.tensorboard_logger = None
    t.best_eval_metric_key, t.best_eval_metric_value, t._latest_eval_metric_value = "", float("-inf"), None
    t._last_step = 0
    t._checkpoint_states = None
    t.step_limit = None
    return t


class AppendGroup:
    """Actor group stand-in: one real DPPOReplayBuffer per rank; fit() runs the planned micro-batches
    and counts them as DPPOActorTrainer does (``micro_batch_counts`` per micro-batch, ``step_counts``)."""

    def __init__(self, dp, args):
        self.buffers = [DPPOReplayBuffer(1, 0, True, True, True) for _ in range(dp)]
        self.args = args
        self.forward = StandInGroup(logprob_fn(0.01, 0.05, 5), dp)

    def async_run_method_batch(self, method_name, **kwargs):
        if method_name == "forward":
            return self.forward.async_run_method_batch(method_name, **kwargs)
        assert method_name == "append"
        (experiences,) = kwargs.values()
        assert len(experiences) == len(self.buffers)  # one batched Experience per rank
        for buffer, exp in zip(self.buffers, experiences):
            buffer.append(exp)
        return []

    def async_run_method(self, method_name, **kwargs):
        if method_name != "fit":
            return [None]
        per_rank, counts, untrained = [], torch.zeros(4, dtype=torch.float64), [0, 0]
        for buffer in self.buffers:
            buffer.setup_dynamic_batch(SimpleNamespace(args=self.args))
            per_rank.append(len(buffer))
            for m in range(len(buffer)):
                counts += micro_batch_counts(buffer.collate_fn([buffer[m]]))
            untrained = [a + b for a, b in zip(untrained, buffer.untrained_counts())]
            buffer.clear()
        assert len(set(per_rank)) == 1
        counted = step_counts(counts, untrained, 1, None)
        return [{"policy_loss": 0.0, "micro_batches": float(per_rank[0]), **counted}]


class HostAppendGroup:
    """Actor group stand-in for the GRPO path: keeps what is appended; fit() counts it as trained, as
    DPPOActorTrainer counts the host's micro-batches (the real buffer's GRPO steps need process groups:
    test_dispatch.py runs them on two gloo ranks)."""

    def __init__(self, dp=1):
        self.appended = []
        self.fitted = 0  # experiences already trained by an earlier fit()
        self.forward = StandInGroup(logprob_fn(0.01, 0.05, 5), dp)
        self.dp = dp

    def async_run_method_batch(self, method_name, **kwargs):
        if method_name == "forward":
            return self.forward.async_run_method_batch(method_name, **kwargs)
        if len(kwargs["experience"]) < self.dp:  # RayActorGroup's round robin: one batch per rank at least
            raise ValueError(f"Insufficient batch size: {len(kwargs['experience'])} for {self.dp} actors")
        self.appended.extend(kwargs["experience"])
        return []

    def async_run_method(self, method_name, **kwargs):
        if method_name != "fit":
            return [None]
        counts = sum((micro_batch_counts(e) for e in self.appended[self.fitted :]), torch.zeros(4))
        self.fitted = len(self.appended)
        return [{"policy_loss": 0.5, **step_counts(counts, [0, 0], 1, None)}]  # every append is trained


def controller(tmp_path, cfg, extra=(), dp=1, batch=6, n_prompts=24, reward=solved_every_4th):
    """A trainer with the real samples generator (stand-in engine), experience maker and, for DPPO (and
    CPPO, which trains through DPPO's plan), the per-rank DPPO replay buffers: a controller step without Ray."""
    args = make_args(base_argv(dp=dp, batch=batch, train_batch=8) + list(extra))
    group = AppendGroup(dp, args) if cfg.method in ("dppo", "cppo") else HostAppendGroup(dp)
    t = bare_trainer(args, cfg, RunDir(str(tmp_path / "run")), group)
    t.history = PromptHistory(n_prompts) if cfg.method == "dppo" else None
    t.tokenizer, t.kl_ctl, t.vllm_engines = StandInTokenizer(), FixedKLController(0.0), None
    t.samples_generator, t.engine = generator_for(args, cfg, t.history, n_prompts, reward)
    if cfg.method == "cppo":
        t.experience_maker = CPPOExperienceMaker(
            group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer, dppo=cfg
        )
    elif cfg.method == "dppo":
        t.experience_maker = DPPOExperienceMaker(group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer,
                                                 dppo=cfg, history=t.history)  # fmt: skip
    else:
        t.experience_maker = CountingExperienceMaker(
            group.forward, None, None, None, t.kl_ctl, t.strategy, t.tokenizer
        )
    return t


def one_step(t):
    """What OpenRLHF's loop does for one step: ask for the rollouts, train them. (status, rollouts)."""
    for _ in range(3):  # an exhausted answer ends an epoch; OpenRLHF's loop then asks again
        samples = t.samples_generator.generate_samples(**GENERATE_KW)[0]
        if samples:
            break
    assert samples, "the stand-in draw gave nothing to train"
    status, t._last_step = t.train_step(samples, t._last_step)
    return status, samples


def schedule_of(args, prompts: int, rule: str, step_limit=None) -> int:
    """The trainer's LR schedule length (``_DPPOTrainer.__init__``): OpenRLHF's ``max_steps`` (its
    ``prepare_datasets``: prompts x G // train batch x episodes x PPO epochs), the steps the short-batch
    rule adds, then ``scheduler_steps``."""
    a = args
    host = (
        prompts
        * a.rollout.n_samples_per_prompt
        // a.train.batch_size
        * a.train.num_episodes
        * a.train.max_epochs
    )
    return scheduler_steps(args, host + short_batch_steps(args, prompts, rule), step_limit)
