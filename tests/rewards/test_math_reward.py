"""The math reward: real answer formats, malformed input, the OpenRLHF contract, bounded time."""

import asyncio
import importlib.util
import json
import threading
import time

import pytest
import torch

from openrlhf_dppo.rewards import reward_path
from openrlhf_dppo.rewards.math_reward import (
    REASONS,
    MathReward,
    MathRewardConfig,
    answer_region,
    response_text,
)

# (label, response, expected reason)
FORMATS = [
    # fractions
    (r"\frac{1}{2}", r"so the answer is \boxed{\dfrac12}.", "correct"),
    (r"\frac{1}{2}", r"\boxed{0.5}", "correct"),
    (r"\frac{1}{2}", r"The final answer is 1/2", "correct"),
    (r"-\frac{3}{4}", r"The answer is $\boxed{-\frac{3}{4}}$.", "correct"),
    (r"0.333", r"\boxed{\frac13}", "wrong"),  # looks right, is not equal
    # radicals
    (r"2\sqrt{3}", r"\boxed{\sqrt{12}}", "correct"),
    (r"2\sqrt{3}", r"\boxed{3\sqrt2}", "wrong"),
    (r"\frac{\sqrt{3}}{2}", r"\boxed{\frac{\sqrt3}{2}}", "correct"),
    (r"\frac{\sqrt{3}}{2}", r"\boxed{\frac{\sqrt2}{2}}", "wrong"),
    # intervals
    (r"(-\infty, 3]", r"\boxed{(-\infty,3]}", "correct"),
    (r"(-\infty, 3]", r"\boxed{(-\infty,3)}", "wrong"),  # open vs closed end
    (r"[2,5)", r"\boxed{[2, 5)}", "correct"),
    # units, degrees, money, percent, thousands separators
    (r"10", r"\boxed{10\text{ cm}}", "correct"),
    (r"45^\circ", r"\boxed{45}", "correct"),
    (r"\$18.90", r"\boxed{18.90}", "correct"),
    (r"1000000", r"\boxed{1,000,000}", "correct"),
    # text answers and choices
    (r"\text{Monday}", r"\boxed{\text{Monday}}", "correct"),
    (r"\text{Monday}", r"\boxed{\text{Tuesday}}", "wrong"),
    (r"\text{(C)}", r"\boxed{C}", "correct"),
    # expressions, equations, sets
    (r"x^2+2x+1", r"\boxed{(x+1)^2}", "correct"),
    (r"y=2x+3", r"\boxed{y = 2x + 3}", "correct"),
    (r"1,2,3", r"\boxed{3, 2, 1}", "correct"),
    (r"-2", r"\boxed{2}", "wrong"),  # sign dropped
    # boxed vs unboxed, several boxes (the last one counts)
    (r"3", r"The answer is 3.", "correct"),
    (r"3", r"First guess \boxed{4}, corrected: \boxed{3}", "correct"),
    (r"3", r"First guess \boxed{3}, corrected: \boxed{4}", "wrong"),
    (r"5", r"\fbox{5}", "correct"),
]


@pytest.fixture(scope="module")
def reward():
    return MathReward(MathRewardConfig(timeout_s=6.0))


@pytest.mark.parametrize("label,response,expected", FORMATS)
def test_answer_formats(reward, label, response, expected):
    reason, _ = reward.judge(response, label)
    assert reason == expected
    assert reward.score(response, label)[0] == (1.0 if expected == "correct" else 0.0)


MALFORMED = [
    ("3", "", "empty"),
    ("3", "   \n\t", "empty"),
    ("3", r"\boxed{3", "no_answer"),  # unbalanced
    ("3", r"}}}}\boxed{{{{3", "no_answer"),
    ("3", r"\boxed{}", "no_answer"),
    ("3", "no number in here at all", "no_answer"),
    ("3", b"\xff\xfe\xfa \\boxed{3}", "correct"),  # non-UTF-8 bytes, decoded with replacement
    ("3", "\udcff\ud800 \\boxed{3}", "correct"),  # lone surrogates
    ("3", None, "bad_input"),
    ("3", ["\\boxed{3}"], "bad_input"),
    ("", r"\boxed{3}", "bad_label"),
    (r"\frac{", r"\boxed{3}", "bad_label"),  # a label that does not parse
    ("}{", r"\boxed{3}", "bad_label"),
    (None, r"\boxed{3}", "bad_input"),
    (3, r"\boxed{3}", "correct"),  # a numeric label is fine
]


@pytest.mark.parametrize("label,response,expected", MALFORMED)
def test_malformed_inputs_never_raise(reward, label, response, expected):
    reason, _ = reward.judge(response, label)
    assert reason == expected


def test_enormous_response_is_cut_to_its_tail(reward):
    # 2 MB of junk before the answer: only the tail is read, and fast
    text = "x{" * 1_000_000 + r" so \boxed{7}"
    t0 = time.monotonic()
    assert reward.judge(text, "7")[0] == "correct"
    assert time.monotonic() - t0 < 2.0
    # an answer buried before the tail is not seen
    assert reward.judge(r"\boxed{7}" + "x" * 20000, "7")[0] == "no_answer"


def test_response_text_strips_prompt_think_and_special_tokens():
    prompt = "<|im_start|>user\nPut the answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    query = prompt + "<think>maybe \\boxed{2}</think>It is \\boxed{5}.<|im_end|><|endoftext|>"
    assert response_text(query, prompt) == "It is \\boxed{5}."
    # the prompt's \boxed{} instruction never counts as an answer
    assert response_text(prompt + "I give up<|im_end|>", prompt) == "I give up"
    # a prompt that does not round-trip exactly: cut after its last 64 characters
    assert response_text("X" + prompt[1:] + "ans", prompt) == "ans"
    assert answer_region("a \\boxed{1} b \\boxed{2} c", 100) == ("\\boxed{2} c", True)
    assert answer_region("just 2", 100) == ("just 2", False)


def test_format_weight_term():
    r = MathReward(MathRewardConfig(format_weight=0.2))
    assert r.score(r"\boxed{4}", "4")[0] == pytest.approx(1.0)
    assert r.score(r"\boxed{5}", "4")[0] == pytest.approx(0.2)  # boxed but wrong
    assert r.score("the answer is 4", "4")[0] == pytest.approx(0.8)  # right but unboxed
    assert r.score("nothing", "4")[0] == 0.0
    with pytest.raises(ValueError, match="format_weight"):
        MathRewardConfig(format_weight=1.5)


def test_config_from_env():
    cfg = MathRewardConfig.from_env(
        {"DPPO_MATH_FORMAT_WEIGHT": "0.1", "DPPO_MATH_TIMEOUT": "4", "DPPO_MATH_MAX_CHARS": "100"}
    )
    assert (cfg.format_weight, cfg.timeout_s, cfg.max_chars, cfg.num_workers) == (0.1, 4.0, 100, 2)


def _load_like_openrlhf():
    """Exactly how OpenRLHF 0.11.2's SingleTurnAgentExecutor loads a ``--reward.remote_url`` file."""
    spec = importlib.util.spec_from_file_location("reward_func", reward_path("math_reward"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


def test_openrlhf_contract_through_the_host_executor(monkeypatch):
    """Load the file through OpenRLHF's own executor and call it the way it does (a worker thread),
    then build the Experience exactly as OpenRLHF's samples generator does."""
    monkeypatch.setenv("DPPO_MATH_TIMEOUT", "6")
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(remote_rm_url=reward_path("math_reward"))
    prompt = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
    cases = [("The product is \\boxed{42}.<|im_end|>", 1.0), ("\\boxed{41}<|im_end|>", 0.0), ("", 0.0)]
    infos = []
    for response, expected in cases:
        [out] = asyncio.run(executor._fetch_rewards_via_func([prompt + response], [prompt], ["42"]))
        assert out["rewards"].shape == (1,) and out["scores"].shape == (1,)
        assert out["rewards"].item() == expected
        assert sorted(out["extra_logs"]) == sorted([f"math/reason_{r}" for r in REASONS] + ["math/boxed"])
        response_dict = {
            "prompt": prompt,
            "label": "42",
            "observation_tokens": [1, 2, 3],
            "action_ranges": [(1, 3)],
            "rollout_log_probs": None,
            "reward": out["rewards"],
            "scores": out["scores"],
            "extra_logs": out["extra_logs"],
        }
        exp = SamplesGenerator._process_response_into_experience(None, response_dict, max_len=16)
        assert exp.rewards.shape == (1,) and exp.rewards.item() == expected
        infos.append(exp.info)
    # the host concatenates info across samples: every sample must carry the same keys
    assert all(info.keys() == infos[0].keys() for info in infos)
    assert torch.cat([i["math/reason_empty"] for i in infos]).tolist() == [0.0, 0.0, 1.0]


def test_off_main_thread_uses_workers_and_enforces_the_deadline():
    """math-verify's signal timeouts fail off the main thread; ours must still bound the time.
    With a 0.5 s budget the worker (whose own timer is 1 s) is killed by the deadline and replaced."""
    reward = MathReward(MathRewardConfig(timeout_s=0.5, num_workers=1))
    results = {}

    def run():
        results["warm"] = reward.judge(r"\boxed{2}", "2")[0]  # starts the worker
        results["first_worker"] = next(iter(reward._pool.live))
        t0 = time.monotonic()
        results["slow"] = reward.judge(r"\boxed{10^{10^{10}}}", "5")[0]  # sympy needs seconds here
        results["slow_s"] = time.monotonic() - t0
        results["after"] = reward.judge(r"\boxed{2}", "2")[0]  # a fresh worker took over

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert results["warm"] == "correct"
    assert results["slow"] == "timeout"
    # killed by the 0.5 s deadline, not answered by its own 1 s timer: the worker was replaced
    assert results["first_worker"].poll() is not None
    assert results["first_worker"] not in reward._pool.live
    assert results["slow_s"] < 2.0
    assert results["after"] == "correct"
    reward._pool.close()


def test_main_thread_timeout_is_counted():
    reward = MathReward(MathRewardConfig(timeout_s=3.0))  # 1 s per math-verify operation
    t0 = time.monotonic()
    assert reward.judge(r"\boxed{10^{10^{10}}}", "5")[0] == "timeout"
    assert time.monotonic() - t0 < 3.5


def test_loaded_by_path_and_many_threads():
    reward_func = _load_like_openrlhf()
    prompt = "Q: 2+2?\nA:"
    out = {}

    def call(i):
        out[i] = reward_func([prompt + f" \\boxed{{{i}}}"], [prompt], ["4"])["scores"].item()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out == {i: float(i == 4) for i in range(8)}


def test_worker_pool_recovers_from_dead_workers_and_never_starves_waiting_threads():
    reward = MathReward(MathRewardConfig(timeout_s=0.5, num_workers=1))
    results = {}

    def in_thread(key, response, label):
        results[key] = reward.judge(response, label)[0]

    def run(*calls):
        threads = [threading.Thread(target=in_thread, args=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

    run(("warm", r"\boxed{2}", "2"))
    # a worker that died between calls: that sample is an "error", the next one gets a new worker
    next(iter(reward._pool.live)).kill()
    run(("dead", r"\boxed{2}", "2"))
    run(("fresh", r"\boxed{2}", "2"))
    # one worker, two threads: the one waiting behind a timed-out check still gets served
    run(("slow", r"\boxed{10^{10^{10}}}", "5"), ("waiting", r"\boxed{3}", "3"))
    assert results == {
        "warm": "correct",
        "dead": "error",
        "fresh": "correct",
        "slow": "timeout",
        "waiting": "correct",
    }
    reward._pool.close()


def test_contract_with_missing_labels_or_prompts_returns_one_entry_per_query():
    reward = MathReward()
    out = reward(["\\boxed{1}", "\\boxed{2}"], None, None)  # OpenRLHF without --data.label_key gives ""
    assert out["rewards"].tolist() == [0.0, 0.0]
    assert out["extra_logs"]["math/reason_bad_input"].tolist() == [1.0, 1.0]
    out = reward(["\\boxed{1}", "\\boxed{2}"], ["p"], ["1"])  # fewer labels than queries
    assert out["scores"].tolist() == [1.0, 0.0]
    assert out["extra_logs"]["math/reason_bad_input"].tolist() == [0.0, 1.0]
    assert reward([], [], [])["rewards"].shape == (0,)
    out = reward(["\\boxed{1}"], [""], [""])  # the empty label OpenRLHF passes without a label key
    assert out["extra_logs"]["math/reason_bad_label"].tolist() == [1.0]


def test_a_json_object_label_is_a_bad_label_not_an_expression_to_compare():
    # a countdown label (a dataset that is not a math dataset): math-verify would read the object's
    # numbers and call a boxed target correct; the reward scores it bad_label and never raises
    label = json.dumps({"numbers": [3, 5, 7], "target": 22})
    out = MathReward()(["so the answer is \\boxed{22}"], [""], [label])
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["math/reason_bad_label"].tolist() == [1.0]
    # a JSON-looking text that is no object stays an expression (a MATH interval or set)
    assert MathReward().judge(r"\boxed{[1, 2]}", "[1, 2]") == ("correct", True)
