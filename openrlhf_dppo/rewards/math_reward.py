"""Rule-based math reward on math-verify, in OpenRLHF 0.11.2's ``reward_func`` contract.

``--reward.remote_url <this file>``: OpenRLHF calls ``reward_func(queries, prompts, labels)`` from a worker
thread. Self-contained (standard library + ``math_verify``). A response's answer region is the text from
its LAST ``\\boxed`` (after the last ``</think>``; without a box, its tail); the reward is
``(1 - w) * correct + w * boxed`` (``w`` = 0 by default). Nothing raises: every failure gives 0 and is
counted in ``extra_logs`` as ``math/reason_<reason>`` (all of ``REASONS``, always present). A check off
the main thread runs in a pool of worker processes (this file with ``--serve``) under a hard deadline.
Settings, read at the first call: ``DPPO_MATH_FORMAT_WEIGHT`` (0.0), ``DPPO_MATH_TIMEOUT`` (10 s),
``DPPO_MATH_MAX_CHARS`` (16384), ``DPPO_MATH_WORKERS`` (2).
"""

import atexit
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

REASONS = ("correct", "wrong", "no_answer", "empty", "bad_label", "bad_input", "timeout", "error")
_SPECIAL_TOKEN = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>|</s>|<s>")
_BOX = re.compile(r"\\(?:boxed|fbox)")


@dataclass(frozen=True)
class MathRewardConfig:
    format_weight: float = 0.0
    timeout_s: float = 10.0
    max_chars: int = 16384
    num_workers: int = 2

    def __post_init__(self):
        if not 0.0 <= self.format_weight <= 1.0:
            raise ValueError(
                f"format_weight must be in [0, 1] (reward = (1-w)*correct + w*boxed), got {self.format_weight}"
            )
        if self.timeout_s <= 0 or self.max_chars <= 0 or self.num_workers <= 0:
            raise ValueError("timeout_s, max_chars and num_workers must be positive")

    @classmethod
    def from_env(cls, environ=None) -> "MathRewardConfig":
        env = os.environ if environ is None else environ
        return cls(
            format_weight=float(env.get("DPPO_MATH_FORMAT_WEIGHT", cls.format_weight)),
            timeout_s=float(env.get("DPPO_MATH_TIMEOUT", cls.timeout_s)),
            max_chars=int(env.get("DPPO_MATH_MAX_CHARS", cls.max_chars)),
            num_workers=int(env.get("DPPO_MATH_WORKERS", cls.num_workers)),
        )


# ----------------------------------------------------------------------------------------- text
def as_text(x) -> str | None:
    """Any input as valid UTF-8 text (bytes decoded, surrogates replaced, numbers formatted); else None."""
    if isinstance(x, bytes | bytearray):
        return bytes(x).decode("utf-8", errors="replace")
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return repr(x)
    if isinstance(x, str):
        return x.encode("utf-8", errors="replace").decode("utf-8")
    return None


def _json_object(text: str) -> bool:
    """True for a JSON object (``{"key": ...}``): no math answer is one."""
    if not text.startswith("{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def response_text(query: str, prompt: str | None) -> str:
    """The model's answer inside ``query`` (= decoded prompt + response, special tokens kept)."""
    if prompt and query.startswith(prompt):
        text = query[len(prompt) :]
    elif prompt and (cut := query.find(prompt[-64:])) >= 0:  # decoding changed the prompt's prefix
        text = query[cut + len(prompt[-64:]) :]
    elif (cut := query.rfind("<|im_start|>assistant")) >= 0:
        text = query[cut + len("<|im_start|>assistant") :]
    else:
        text = query
    if (cut := text.rfind("</think>")) >= 0:
        text = text[cut + len("</think>") :]
    return _SPECIAL_TOKEN.sub("", text)


def answer_region(response: str, max_chars: int) -> tuple[str, bool]:
    """(the text math-verify should read: from the last box on, else the tail; whether it is boxed)."""
    tail = response[-max_chars:]
    last = None
    for last in _BOX.finditer(tail):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return tail, False
    return "\\boxed" + tail[last.end() :], True


# ------------------------------------------------------------------------------------- checking
def _check(region: str, label: str, op_timeout: int) -> str:
    """One comparison with math-verify (its signal timeouts: main thread only). Returns a reason."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold_text = label if ("$" in label.replace("\\$", "") or "\\boxed" in label) else f"${label}$"
    gold = parse(gold_text, extraction_config=configs, parsing_timeout=op_timeout)
    if not any(not isinstance(g, str) for g in gold):
        return "bad_label"
    # math-verify swallows its own timeouts (an empty parse, a False verdict): tell them by the clock
    start = time.monotonic()
    pred = parse(region, extraction_config=configs, parsing_timeout=op_timeout)
    if not pred:
        return "timeout" if time.monotonic() - start >= op_timeout else "no_answer"
    start = time.monotonic()
    if verify(gold, pred, timeout_seconds=op_timeout):
        return "correct"
    return "timeout" if time.monotonic() - start >= op_timeout else "wrong"


def _safe_check(region: str, label: str, op_timeout: int) -> str:
    try:
        return _check(region, label, op_timeout)
    except Exception:
        return "error"


class _WorkerPool:
    """Worker processes that run ``_check`` on their main thread; one request at a time each."""

    def __init__(self, size: int):
        self.size = size
        self.idle: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.started = 0
        self.live: set = set()
        atexit.register(self.close)

    def _spawn(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        if self._read(proc, 120.0) != {"ready": True}:  # importing sympy can take seconds
            proc.kill()
            raise RuntimeError("math reward worker did not start")
        self.live.add(proc)
        return proc

    @staticmethod
    def _read(proc: subprocess.Popen, timeout: float):
        """The next JSON line of the worker; "late" past ``timeout``, None if it died or sent garbage."""
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            return "late"
        line = proc.stdout.readline()
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    def _acquire(self) -> subprocess.Popen:
        """An idle worker, or a new one while fewer than ``size`` live (waiting callers poll)."""
        while True:
            with self.lock:
                try:
                    return self.idle.get_nowait()
                except queue.Empty:
                    spawn = self.started < self.size
                    if spawn:
                        self.started += 1
            if spawn:
                try:
                    return self._spawn()
                except Exception:
                    with self.lock:
                        self.started -= 1
                    raise
            try:
                return self.idle.get(timeout=0.05)
            except queue.Empty:
                continue

    def check(self, region: str, label: str, op_timeout: int, deadline_s: float) -> str:
        proc = self._acquire()
        try:
            proc.stdin.write(
                (json.dumps({"region": region, "label": label, "t": op_timeout}) + "\n").encode()
            )
            reply = self._read(proc, deadline_s)
        except (OSError, ValueError):  # the worker is gone (broken pipe)
            reply = None
        if not isinstance(reply, dict) or "reason" not in reply:  # late or dead: replace it
            proc.kill()
            proc.wait()
            self.live.discard(proc)
            with self.lock:
                self.started -= 1
            return "timeout" if reply == "late" else "error"
        self.idle.put(proc)
        return reply["reason"]

    def close(self):
        for proc in list(self.live):
            proc.kill()
        self.live.clear()


def _serve():
    """Worker loop: one JSON request per line on stdin, one JSON reply per line on stdout."""
    # warm up before announcing readiness: the first check in a process loads sympy's LaTeX parser,
    # which under load takes longer than a short deadline and would count as a spurious timeout
    _safe_check("\\boxed{\\frac{1}{2}}", "0.5", 30)

    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        req = json.loads(line)
        out.write(
            (json.dumps({"reason": _safe_check(req["region"], req["label"], req["t"])}) + "\n").encode()
        )
        out.flush()


# ---------------------------------------------------------------------------------------- reward
class MathReward:
    """Scores responses against labels; ``score`` for one sample, ``__call__`` for the contract."""

    def __init__(self, config: MathRewardConfig | None = None):
        self.config = config or MathRewardConfig()
        self._pool: _WorkerPool | None = None
        self._pool_lock = threading.Lock()

    def _op_timeout(self) -> int:
        # three timed operations per sample (parse label, parse answer, compare); alarm() takes ints
        return max(1, int(self.config.timeout_s // 3))

    def judge(self, response, label) -> tuple[str, bool]:
        """(reason, boxed) for one response text (prompt already removed) and its label."""
        text, gold = as_text(response), as_text(label)
        if text is None or gold is None:
            return "bad_input", False
        gold = gold.strip()
        if not gold or _json_object(gold):
            return "bad_label", False
        if not text.strip():
            return "empty", False
        region, boxed = answer_region(text, self.config.max_chars)
        if threading.current_thread() is threading.main_thread():
            return _safe_check(region, gold, self._op_timeout()), boxed
        with self._pool_lock:
            if self._pool is None:
                self._pool = _WorkerPool(self.config.num_workers)
        try:
            return self._pool.check(region, gold, self._op_timeout(), self.config.timeout_s), boxed
        except Exception:
            return "error", boxed

    def score(self, response, label) -> tuple[float, str]:
        """(reward, reason) for one response text (prompt already removed)."""
        reason, boxed = self.judge(response, label)
        return self._reward(reason, boxed), reason

    def _reward(self, reason: str, boxed: bool) -> float:
        w = self.config.format_weight
        return (1.0 - w) * float(reason == "correct") + w * float(boxed)

    def __call__(self, queries, prompts, labels, **kwargs) -> dict:
        """OpenRLHF's contract: ``{"rewards": (n,), "scores": (n,), "extra_logs": {key: (n,)}}``;
        ``scores`` is the 0/1 correctness, ``rewards`` adds the format term; every key for every sample."""
        import torch

        queries = list(queries) if queries is not None else []
        # missing prompts / labels (no --data.label_key) score as bad input instead of raising
        prompts = list(prompts) if prompts is not None else []
        labels = list(labels) if labels is not None else []
        rewards, scores, reasons, boxes = [], [], [], []
        for i, query in enumerate(queries):
            label = labels[i] if i < len(labels) else None
            text = as_text(query)
            response = (
                response_text(text, as_text(prompts[i]) if i < len(prompts) else None) if text else text
            )
            reason, boxed = self.judge(response, label)
            rewards.append(self._reward(reason, boxed))
            scores.append(float(reason == "correct"))
            reasons.append(reason)
            boxes.append(float(boxed))
        extra_logs = {f"math/reason_{r}": torch.tensor([float(x == r) for x in reasons]) for r in REASONS}
        extra_logs["math/boxed"] = torch.tensor(boxes)
        return {
            "rewards": torch.tensor(rewards, dtype=torch.float32),
            "scores": torch.tensor(scores, dtype=torch.float32),
            "extra_logs": extra_logs,
        }


_DEFAULT: MathReward | None = None
_DEFAULT_LOCK = threading.Lock()


def reward_func(queries, prompts, labels, **kwargs) -> dict:
    """The entry point OpenRLHF looks up in this file (settings from ``DPPO_MATH_*``)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathReward(MathRewardConfig.from_env())
    return _DEFAULT(queries, prompts, labels, **kwargs)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    sys.path.pop(0)  # this file's folder: its other modules must not shadow what math_verify imports
    _serve()
