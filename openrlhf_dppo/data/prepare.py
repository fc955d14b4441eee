"""Turn math datasets into the JSONL layout OpenRLHF 0.11.2 reads.

    python -m openrlhf_dppo.data.prepare --out data/math \\
        --train math --eval math500,aime24,amc23,minerva,olympiadbench,aime25

Each benchmark becomes ``<out>/<name>.jsonl``: ``{"prompt", "answer", "datasource", "problem"}`` per line
(``--data.input_key prompt --data.label_key answer``). Sources, tried in order: ``--source NAME=PATH``,
``--local-dir DIR``, the Hugging Face hub (``BENCHMARKS``); none: a message saying where to put the files.
``demo_train`` / ``demo_eval`` are shipped in ``openrlhf_dppo/data/shipped/`` (no download needed).
"""

import argparse
import json
import os
import sys
from dataclasses import dataclass

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shipped")
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PROBLEM_KEYS = ("problem", "question", "Problem", "Question", "prompt")
ANSWER_KEYS = ("answer", "Answer", "final_answer", "solution")


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark lives and how to read its answer: ``answer_from`` "field" (as is), "boxed" (the
    last \\boxed{} of a worked solution), "gsm8k" (the text after "####")."""

    hub: str
    split: str
    config: str | None = None
    answer_from: str = "field"
    answer_keys: tuple = ANSWER_KEYS


BENCHMARKS = {
    "math": Benchmark(
        "DigitalLearningGmbH/MATH-lighteval", "train", answer_from="boxed", answer_keys=("solution",)
    ),
    "math500": Benchmark("HuggingFaceH4/MATH-500", "test"),
    "aime24": Benchmark("HuggingFaceH4/aime_2024", "train"),
    "aime25": Benchmark("MathArena/aime_2025", "train"),
    "amc23": Benchmark("math-ai/amc23", "test"),
    "minerva": Benchmark("math-ai/minervamath", "test"),
    "olympiadbench": Benchmark("math-ai/olympiadbench", "test"),
    "gsm8k": Benchmark("openai/gsm8k", "test", config="main", answer_from="gsm8k"),
    "demo_train": Benchmark(os.path.join(SHIPPED_DIR, "demo_train.jsonl"), "train"),
    "demo_eval": Benchmark(os.path.join(SHIPPED_DIR, "demo_eval.jsonl"), "train"),
}
DEFAULT_EVAL = "math500,aime24,amc23,minerva,olympiadbench,aime25"


class DataError(Exception):
    """A benchmark could not be found or read; the message says what to do."""


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces) in a worked solution, else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def format_answer(value) -> str:
    """A label as a string: lists joined by ", ", integral floats without ".0", ``$`` stripped."""
    if isinstance(value, list | tuple):
        return ", ".join(format_answer(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().strip("$").strip()


def to_record(row: dict, name: str, bench: Benchmark, instruction: str) -> dict:
    problem_key = next((k for k in PROBLEM_KEYS if k in row), None)
    answer_key = next((k for k in bench.answer_keys if k in row), None)
    if problem_key is None or answer_key is None:
        raise DataError(
            f"{name}: a row has none of the problem fields {PROBLEM_KEYS} or answer fields "
            f"{bench.answer_keys}; its fields are {sorted(row)}"
        )
    raw = row[answer_key]
    if bench.answer_from == "boxed":
        raw = last_boxed(str(raw))
    elif bench.answer_from == "gsm8k":
        raw = str(raw).split("####")[-1].replace(",", "")
    answer = format_answer(raw) if raw is not None else ""
    problem = str(row[problem_key]).strip()
    prompt = f"{problem}\n{instruction}" if instruction else problem
    return {"prompt": prompt, "answer": answer, "datasource": name, "problem": problem}


def _load_path(path: str, split: str) -> list[dict]:
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    import datasets

    if os.path.isdir(path):
        try:
            data = datasets.load_from_disk(path)
        except Exception:
            data = datasets.load_dataset(path)
    else:
        data = datasets.load_dataset(os.path.splitext(path)[1].lower().lstrip("."), data_files=path)
    if isinstance(data, datasets.DatasetDict):
        data = data[split] if split in data else data[next(iter(data))]
    return list(data)


def load_rows(name: str, bench: Benchmark, local_dir: str | None, source: str | None) -> list[dict]:
    """The raw rows of one benchmark from the first place that has it (see the module docstring)."""
    local = (
        [os.path.join(local_dir, name + ext) for ext in (".jsonl", ".json", ".parquet", "")]
        if local_dir
        else []
    )
    for path in ([source] if source else []) + local + [bench.hub]:
        if os.path.exists(path):
            return _load_path(path, bench.split)
    hub = source or bench.hub  # not a local path: a hub id
    try:
        import datasets

        return list(datasets.load_dataset(hub, bench.config, split=bench.split))
    except Exception as err:
        where = local_dir or "<dir>"
        raise DataError(
            f"cannot load benchmark '{name}': no local copy and the Hugging Face hub failed for {hub} "
            f"(split {bench.split}): {type(err).__name__}: {str(err)[:300]}\n"
            f"Offline? Put a copy at {os.path.join(where, name + '.jsonl')} (one JSON object per line with "
            f"a problem field {PROBLEM_KEYS[:2]} and an answer field {bench.answer_keys[:2]}), or "
            f"{name}.parquet, or a datasets.save_to_disk folder {name}/, and pass --local-dir {where}; "
            f"or pass --source {name}=<path>."
        ) from err


def prepare(
    names: list[str],
    out_dir: str,
    local_dir: str | None = None,
    sources: dict | None = None,
    instruction: str = DEFAULT_INSTRUCTION,
    max_samples: int | None = None,
) -> dict:
    """Write ``<out_dir>/<name>.jsonl`` for each name; returns ``{name: (path, n_problems)}``."""
    sources = sources or {}
    unknown = [n for n in names if n not in BENCHMARKS and n not in sources]
    if unknown:
        raise DataError(
            f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)} (or pass --source NAME=PATH)"
        )
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for name in names:
        bench = BENCHMARKS.get(name, Benchmark(hub=sources.get(name, ""), split="test"))
        rows = load_rows(name, bench, local_dir, sources.get(name))
        records = [to_record(dict(row), name, bench, instruction) for row in rows[:max_samples]]
        labelled = [r for r in records if r["answer"]]  # a problem without a label cannot be scored
        if len(labelled) < len(records):
            print(f"[prepare] {name}: left out {len(records) - len(labelled)} problem(s) without a label")
        records = labelled
        path = os.path.join(out_dir, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        written[name] = (path, len(records))
    return written


def _split_names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder for <name>.jsonl")
    parser.add_argument("--train", default="math", help="training set(s), comma-separated ('' for none)")
    parser.add_argument(
        "--eval", default=DEFAULT_EVAL, help="evaluation set(s), comma-separated ('' for none)"
    )
    parser.add_argument("--local-dir", default=None, help="folder with local copies <name>.jsonl|.parquet|/")
    parser.add_argument("--source", action="append", default=[], metavar="NAME=PATH_OR_HUB_ID")
    parser.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="appended to every problem")
    parser.add_argument("--max-samples", type=int, default=None, help="keep the first N problems of each")
    args = parser.parse_args(argv)

    sources = dict(s.split("=", 1) for s in args.source)
    names = _split_names(args.train) + _split_names(args.eval)
    try:
        written = prepare(names, args.out, args.local_dir, sources, args.instruction, args.max_samples)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, (path, n) in written.items():
        print(f"{name:>15}: {n:6d} problems -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
