"""OpenRLHF's own in-training evaluation (--eval.dataset, --eval.n_samples_per_prompt) on our prepared
files and our reward: the files load through OpenRLHF's loader, and its pass@n metrics come out per
benchmark (the ``datasource`` field) with the values our reward implies."""

import asyncio
from types import SimpleNamespace

import pytest

from openrlhf_dppo.data.prepare import prepare
from openrlhf_dppo.rewards import reward_path


def test_eval_flags_work_with_prepared_files_and_the_math_reward(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # the datasets cache of the loader below
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets
    from openrlhf.trainer.ppo_trainer import compute_eval_metrics
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    written = prepare(["demo_eval", "demo_train"], str(tmp_path / "data"))
    data_arg = ",".join(path for path, _ in written.values())  # what --eval.dataset receives
    args = SimpleNamespace(
        use_ms=False,
        data=SimpleNamespace(
            input_key="prompt", label_key="answer", apply_chat_template=False, image_key="images"
        ),
    )
    strategy = SimpleNamespace(args=args, print=lambda *a: None, is_rank_0=lambda: False)
    data = blending_datasets(data_arg, None, strategy, dataset_split="train")  # --eval.split train
    dataset = PromptDataset(data, tokenizer=None, strategy=strategy)
    assert len(dataset) == 16 + 32
    batches = [dataset.collate_fn([dataset[i]]) for i in range(len(dataset))]  # batch size 1, as OpenRLHF

    # two samples per prompt (--eval.n_samples_per_prompt 2): problem i of each benchmark gets
    # [right, wrong] if i is even, else [wrong, wrong]
    executor = SingleTurnAgentExecutor(remote_rm_url=reward_path("math_reward"))
    samples = []
    for i, (_, [prompt], [label], _) in enumerate(batches):
        index = i if i < 16 else i - 16
        for j in range(2):
            answer = label if (index % 2 == 0 and j == 0) else "123456789"
            query = prompt + f" ... so the answer is $\\boxed{{{answer}}}$"
            [out] = asyncio.run(executor._fetch_rewards_via_func([query], [prompt], [label]))
            response = {
                "prompt": prompt,
                "label": label,
                "observation_tokens": [1, 2, 3, 4],
                "action_ranges": [(2, 4)],
                "rollout_log_probs": None,
                "reward": out["rewards"],
                "scores": out["scores"],
                "extra_logs": out["extra_logs"],
            }
            samples.append(SamplesGenerator._process_response_into_experience(None, response, max_len=16))
    logs = compute_eval_metrics(batches, samples, 2)
    # even-indexed problems: pass1 = 1/2, pass2 = 1; odd: 0 -> demo_eval (16): pass1 = 0.25, pass2 = 0.5
    assert logs["eval_demo_eval_pass1"] == pytest.approx(0.25, abs=1e-12)
    assert logs["eval_demo_eval_pass2"] == pytest.approx(0.5, abs=1e-12)
    assert logs["eval_demo_train_pass1"] == pytest.approx(0.25, abs=1e-12)
    assert logs["eval_demo_train_pass2"] == pytest.approx(0.5, abs=1e-12)
    assert logs["eval_num_samples"] == 96.0
