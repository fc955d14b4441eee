"""Run the real ``DPPOTrainer.fit`` in this process until a signal stops it (for test_trainer_stop.py).

    python trainer_stop_worker.py RUN_DIR READY_FILE

As in a Ray actor: Ray's own worker SIGTERM handler is installed (it raises ``SystemExit``, as
``ray._private.worker.Worker.main_loop`` does), the trainer resumes from a checkpoint at step 6, and
OpenRLHF's training loop (the host ``fit``) is a stand-in that waits, as a step in progress would.
READY_FILE is written once ``fit`` is inside the host loop. Everything of ours is the real code.
"""

import os
import signal
import sys
import time

import openrlhf_dppo  # noqa: F401 - the flash-attn stand-in, before any OpenRLHF module loads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(run_dir: str, ready: str) -> None:
    import ray._private.utils as ray_utils
    from dppo_pipeline import CheckpointGroup, bare_trainer
    from dppo_stand_ins import FAKE_RAY, base_argv, make_args
    from openrlhf.trainer import ppo_trainer
    from ray._raylet import raise_sys_exit_with_custom_error_message

    from openrlhf_dppo.adapters import trainer as trainer_module
    from openrlhf_dppo.core import DPPOConfig
    from openrlhf_dppo.run_dir import RunDir

    ppo_trainer.ray = FAKE_RAY
    ckpt = os.path.join(run_dir, "ckpt")
    os.makedirs(os.path.join(ckpt, "_actor"), exist_ok=True)
    args = make_args(base_argv() + ["--ckpt.path", ckpt, "--ckpt.load_enable"])
    states = {"episode": 0, "global_step": 6, "total_consumed_prompts": 24, "data_loader_state_dict": {}}
    t = bare_trainer(args, DPPOConfig(), RunDir(run_dir, max_steps=9), CheckpointGroup(states))
    t.samples_generator.generate_samples = lambda **kwargs: ([], 0.0, 0, True)
    t.eval_dataloader = None

    def host_fit(self, global_step=0):  # OpenRLHF's fit: the checkpoint states, then a step that takes long
        self.init_checkpoint_states()
        open(ready, "w").close()
        time.sleep(120)

    trainer_module._PPOTrainerBase.fit = host_fit  # the host class _DPPOTrainer extends

    def sigterm_handler(signum, frame):  # Ray's worker handler (ray/_private/worker.py, main_loop)
        raise_sys_exit_with_custom_error_message("The process receives a SIGTERM.", exit_code=1)

    ray_utils.set_sigterm_handler(sigterm_handler)
    # Ctrl-C in a terminal: Python's own handler. A process started from a shell's background job (`make
    # test &`, nohup) inherits SIGINT ignored, and Python then leaves it ignored, so set it here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t.fit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
