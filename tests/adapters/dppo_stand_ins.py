"""Stand-ins for what the adapter tests cannot run on CPU: Ray's object transport, the Ray actor groups
(model forwards with deterministic log-probs) and the vLLM engines (responses and rewards). Everything
else -- OpenRLHF's Experience, SamplesGenerator / RemoteExperienceMaker logic, PolicyLoss,
aggregate_loss, the replay buffer, and all of openrlhf_dppo -- is the real code.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

from openrlhf.datasets import PromptDataset
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from torch.utils.data import DataLoader

from openrlhf_dppo.cli import train_dppo_ray as cli

FAKE_RAY = SimpleNamespace(
    put=lambda x: x,
    get=lambda x: x,
    wait=lambda refs, num_returns=1, timeout=None: (list(refs[:num_returns]), list(refs[num_returns:])),
)


def base_argv(
    dp: int = 1, batch: int = 4, group: int = 4, train_batch: int = 16, tokens: int = 64
) -> list[str]:
    return [
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(dp),
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", str(dp),
        "--vllm.num_engines", "1",
        "--actor.model_name_or_path", "tiny",
        "--reward.remote_url", "reward.py",
        "--rollout.batch_size", str(batch), "--rollout.n_samples_per_prompt", str(group),
        "--rollout.micro_batch_size", "1", "--train.micro_batch_size", "1",
        "--train.batch_size", str(train_batch), "--train.max_tokens_per_gpu", str(tokens),
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--data.max_len", "48", "--rollout.max_new_tokens", "24",
    ]  # fmt: skip


def make_args(argv: list[str]):
    """The namespace OpenRLHF's own parser + validation produce for ``argv`` (through our CLI)."""
    out = {}
    cli.main(argv, train_fn=lambda a: out.setdefault("args", a))
    return out["args"]


def logprob_fn(scale: float, offset: float, modulus: int):
    def forward(sequences, action_mask, attention_mask, **_):
        seq = sequences[:, 1:].float()
        return -(offset + scale * (seq % modulus)) * action_mask.float()

    return forward


class StandInGroup:
    """RayActorGroup stand-in: ``forward`` runs ``fn`` per chunk, like the real group's round robin."""

    def __init__(self, fn, n_actors: int = 1):
        self.fn = fn
        self.n_actors = n_actors
        self.forwarded = 0  # sequences forwarded
        self.calls: list[tuple[str, dict]] = []

    def async_run_method_batch(self, method_name, **kwargs):
        assert method_name == "forward", method_name
        n = len(next(iter(kwargs.values())))
        assert n >= self.n_actors
        size = -(-n // self.n_actors)
        out = []
        for a in range(self.n_actors):
            chunk = {k: v[a * size : (a + 1) * size] for k, v in kwargs.items()}
            results = []
            for i in range(len(next(iter(chunk.values())))):
                item = {k: v[i] for k, v in chunk.items()}
                self.forwarded += item["sequences"].shape[0]
                results.append(self.fn(**item))
            out.append(results)
        return out

    def async_run_method(self, method_name, *args, **kwargs):
        self.calls.append((method_name, kwargs))
        return [None] * self.n_actors


def rollout(prompt: str, prompt_len: int, resp_len: int, reward: float, seed: int, truncated: bool = False):
    """One rollout Experience built by OpenRLHF's own SamplesGenerator._process_response_into_experience."""
    rng = random.Random(seed)
    tokens = [rng.randrange(3, 50) for _ in range(prompt_len + resp_len)]
    response = {
        "observation_tokens": tokens,
        "action_ranges": [(prompt_len, prompt_len + resp_len)],
        "reward": reward,
        "scores": reward,
        # vLLM's log-probs: the stand-in actor's (logprob_fn(0.01, 0.05, 5)) plus a token-dependent
        # mismatch, so that the rollout importance-sampling correction has something to correct
        "rollout_log_probs": [-(0.05 + 0.01 * (t % 5)) + 0.1 * ((t % 7) - 3) for t in tokens],
        "prompt": prompt,
        "label": "",
        "truncated": truncated,
        "extra_logs": {},
    }
    return SamplesGenerator._process_response_into_experience(None, response, max_len=4096)


def rollout_batch(n_prompts: int, group: int, seed: int = 0, binary: bool = True):
    """n_prompts groups of ``group`` rollouts with mixed lengths and rewards (some all-equal groups)."""
    rng = random.Random(seed)
    samples = []
    for j in range(n_prompts):
        p_len = rng.randrange(3, 8)
        all_same = j % 3 == 2
        for i in range(group):
            r = 1.0 if all_same else (float(rng.random() < 0.5) if binary else round(rng.uniform(-1, 1), 3))
            samples.append(rollout(f"prompt {j}", p_len, rng.randrange(2, 20), r, seed * 1000 + j * 50 + i))
    return samples


class StandInTokenizer:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return [" ".join(map(str, row.tolist())) for row in ids]


class Remote:
    def __init__(self, fn):
        self.remote = fn


def solved_every_4th(prompt: str, i: int):
    """Rewards of the stand-in engine: every 4th prompt all G right, the others half right."""
    return 1.0 if int(prompt.split()[-1]) % 4 == 0 else float(i % 2)  # every 4th prompt: all G correct


class StandInEngine:
    """vLLM engine stand-in: G responses per prompt, rewards from ``reward(prompt, i)`` (None: what
    OpenRLHF's executor leaves when the reward function raised)."""

    def __init__(self, reward=solved_every_4th):
        self.reward = reward
        self.prompts = []
        self.generate_responses = Remote(self._generate)
        self.get_num_unfinished_requests = Remote(lambda: 0)

    def _generate(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples, images=None):
        self.prompts.append(prompt)
        rng = random.Random(prompt)
        out = []
        for i in range(num_samples):
            n = rng.randrange(2, 6)
            reward = self.reward(prompt, i)
            out.append({
                "observation_tokens": [5, 6, 7] + [rng.randrange(3, 40) for _ in range(n)],
                "action_ranges": [(3, 3 + n)], "reward": reward, "scores": reward,
                "rollout_log_probs": None, "prompt": prompt, "label": label, "truncated": False, "extra_logs": {},
            })  # fmt: skip
        return out


def generator_for(args, cfg, history, n_prompts: int = 12, reward=solved_every_4th, step_limit=None):
    """The real DPPOSamplesGenerator over prompts "question 0..n-1" (eval: "eval 0..5") and one
    stand-in engine; returns (generator, engine)."""
    from openrlhf_dppo.adapters.samples_generator import DPPOSamplesGenerator

    strategy = SimpleNamespace(args=args, is_rank_0=lambda: True)
    train = PromptDataset([{"input": f"question {i}"} for i in range(n_prompts)], None, strategy)
    evals = PromptDataset([{"input": f"eval {i}"} for i in range(6)], None, strategy)
    engine = StandInEngine(reward)
    gen = DPPOSamplesGenerator(
        strategy=strategy,
        prompts_dataloader=DataLoader(train, batch_size=1, shuffle=False, collate_fn=train.collate_fn),
        eval_dataloader=DataLoader(evals, batch_size=1, shuffle=False, collate_fn=evals.collate_fn),
        tokenizer=None,
        vllm_engines=[engine],
        dppo=cfg,
        history=history,
        step_limit=step_limit,
    )
    return gen, engine


#: sampling settings of the stand-in generation
GENERATE_KW = dict(max_len=48, max_new_tokens=24, temperature=1.0, top_p=1.0)
