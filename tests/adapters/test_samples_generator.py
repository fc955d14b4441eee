"""Prompt pruning in OpenRLHF's SamplesGenerator with stand-in vLLM engines: only kept prompts reach
vLLM, the samples carry (dataset index, q), evaluation prompts are never pruned, refill draws more."""

import random
from types import SimpleNamespace

import pytest
import torch
from dppo_stand_ins import FAKE_RAY, base_argv, make_args
from openrlhf.datasets import PromptDataset
from openrlhf.trainer.ppo_utils import samples_generator as host_generator
from torch.utils.data import DataLoader

from openrlhf_dppo.adapters.samples_generator import PROMPT_ATTR, DPPOSamplesGenerator
from openrlhf_dppo.core import DPPOConfig, PromptHistory, prompt_keep_probs, sample_mask, step_generator


@pytest.fixture(autouse=True)
def stand_in_ray(monkeypatch):
    monkeypatch.setattr(host_generator, "ray", FAKE_RAY)


class Remote:
    def __init__(self, fn):
        self.remote = fn


class StandInEngine:
    """vLLM engine stand-in: G responses per prompt, rewards from a per-prompt success rate."""

    def __init__(self):
        self.prompts = []
        self.generate_responses = Remote(self._generate)
        self.get_num_unfinished_requests = Remote(lambda: 0)

    def _generate(self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples, images=None):
        self.prompts.append(prompt)
        rng = random.Random(prompt)
        solved = int(prompt.split()[-1]) % 4 == 0  # every 4th prompt: all G completions correct
        out = []
        for i in range(num_samples):
            n = rng.randrange(2, 6)
            reward = 1.0 if solved else float(i % 2)
            out.append({
                "observation_tokens": [5, 6, 7] + [rng.randrange(3, 40) for _ in range(n)],
                "action_ranges": [(3, 3 + n)], "reward": reward, "scores": reward,
                "rollout_log_probs": None, "prompt": prompt, "label": label, "truncated": False, "extra_logs": {},
            })  # fmt: skip
        return out


def make_generator(cfg, n_prompts=12, batch=4, extra=(), seen=True):
    args = make_args(base_argv(batch=batch) + list(extra))
    strategy = SimpleNamespace(args=args, is_rank_0=lambda: True)
    train = PromptDataset([{"input": f"question {i}"} for i in range(n_prompts)], None, strategy)
    evals = PromptDataset([{"input": f"eval {i}"} for i in range(6)], None, strategy)
    history = PromptHistory(n_prompts)
    # prompts 0..5 were seen: 0-2 always solved (score ~ 0), 3-5 half solved; 6.. never seen
    if seen:
        history.update(torch.arange(6), torch.tensor([[1.0] * 4] * 3 + [[1.0, 0, 1, 0]] * 3), 0)
    engine = StandInEngine()
    gen = DPPOSamplesGenerator(
        strategy=strategy,
        prompts_dataloader=DataLoader(train, batch_size=1, shuffle=False, collate_fn=train.collate_fn),
        eval_dataloader=DataLoader(evals, batch_size=1, shuffle=False, collate_fn=evals.collate_fn),
        tokenizer=None,
        vllm_engines=[engine],
        dppo=cfg,
        history=history,
    )
    return gen, engine, history


KW = dict(max_len=48, max_new_tokens=24, temperature=1.0, top_p=1.0)


def test_only_kept_prompts_reach_vllm_and_samples_carry_index_and_q():
    cfg = DPPOConfig(prompt_prune_rate=0.5, q_min=0.1, seed=5)
    gen, engine, history = make_generator(cfg)
    samples, _, consumed, exhausted = gen.generate_samples(**KW)
    # the same decision recomputed with core: prompts 0..3 drawn, q from their history scores
    q, _ = prompt_keep_probs(history.score(torch.arange(4), 4), 0.5, 0.1)
    mask, q_used = sample_mask(q, "systematic", step_generator(5, 0, 0))
    kept = mask.nonzero().flatten().tolist()
    assert 0 < len(kept) < 4 and consumed == 4 and not exhausted
    assert sorted(engine.prompts) == sorted(f"question {k}" for k in kept)
    assert len(samples) == 4 * len(kept)
    for s in samples:
        draw = getattr(s, PROMPT_ATTR)
        assert s.prompts[0] == f"question {draw.index}"
        assert draw.q == pytest.approx(float(q_used[draw.index]), rel=1e-12)
    assert gen.last_draw.drawn == 4 and gen.last_draw.kept == len(kept)
    counts = gen.pop_counts()
    assert counts == {
        "prompts/drawn": 4.0,
        "prompts/rolled_out": float(len(kept)),
        "prompts/pruned": 4.0 - len(kept),
    }
    assert gen.pop_counts()["prompts/drawn"] == 0.0

    engine.prompts.clear()
    evals = gen.generate_eval_samples(**KW, n_samples_per_prompt=2)
    assert sorted(engine.prompts) == [f"eval {i}" for i in range(6)]  # evaluation is never pruned
    assert len(evals) == 12 and gen.draws == 1


def test_refill_draws_more_prompts_and_unseen_prompts_are_always_kept():
    cfg = DPPOConfig(prompt_prune_rate=0.5, q_min=0.1, prompt_batch="refill", seed=1)
    gen, engine, _ = make_generator(cfg, n_prompts=16)
    samples, _, consumed, _ = gen.generate_samples(**KW)
    assert consumed == 8  # floor(4 / (1 - 0.5)) prompts drawn: 0..7
    assert gen.last_draw.kept <= 4  # the rolled-out batch stays within --rollout.batch_size
    assert {"question 6", "question 7"} <= set(engine.prompts)  # never seen -> q = 1
    assert all(
        getattr(s, PROMPT_ATTR).q == 1.0 for s in samples if s.prompts[0] in ("question 6", "question 7")
    )


def test_refill_rolls_out_and_returns_every_kept_prompt_of_a_draw_in_its_own_step():
    """All prompts unseen (epoch 1): q = 1 keeps all floor(4 / 0.5) = 8 drawn prompts. Their 32 rollouts
    belong to this step (its normaliser counts 8 prompts drawn); the next step is a new draw."""
    cfg = DPPOConfig(prompt_prune_rate=0.5, q_min=0.1, prompt_batch="refill", seed=1)
    gen, engine, _ = make_generator(cfg, n_prompts=16, seen=False)
    for step in range(2):
        engine.prompts.clear()
        samples, _, consumed, exhausted = gen.generate_samples(**KW)
        drawn = {f"question {i}" for i in range(8 * step, 8 * step + 8)}
        assert consumed == 8 and set(engine.prompts) == drawn  # a fresh draw, all of it rolled out
        assert len(samples) == 8 * 4 and {s.prompts[0] for s in samples} == drawn
        assert gen.last_draw.drawn == gen.last_draw.kept == 8
        assert gen.pop_counts()["prompts/rolled_out"] == 8.0
    assert not exhausted
    assert gen.generate_samples(**KW)[::2] == ([], 0)  # 16 prompts, two draws: nothing was left over


def test_an_exhausted_dataloader_ends_the_epoch_without_a_draw():
    gen, engine, _ = make_generator(DPPOConfig(prompt_prune_rate=0.5), n_prompts=4)
    gen.generate_samples(**KW)  # draws all 4 prompts
    samples, _, consumed, exhausted = gen.generate_samples(**KW)
    assert samples == [] and consumed == 0 and exhausted and gen.draws == 1


def test_dynamic_filtering_replacements_are_rolled_out_unpruned():
    cfg = DPPOConfig(prompt_prune_rate=0.25, q_min=0.1, seed=2)
    gen, engine, _ = make_generator(cfg, n_prompts=16, extra=["--algo.dynamic_filtering_enable"])
    samples, pass_rate, consumed, _ = gen.generate_samples(**KW)
    kept = gen.last_draw.kept
    accepted = {s.prompts[0] for s in samples}
    assert all(int(p.split()[-1]) % 4 for p in accepted)  # all-solved groups were filtered out by OpenRLHF
    replacements = [p for p in engine.prompts if int(p.split()[-1]) >= 4]
    assert replacements and consumed == 4 + len(replacements) == gen.last_draw.drawn
    assert gen.last_draw.rolled_out == kept + len(replacements)
    for s in samples:
        if s.prompts[0] in replacements:
            assert getattr(s, PROMPT_ATTR).q == 1.0
    assert pass_rate == pytest.approx(len(samples) / consumed * 100)
