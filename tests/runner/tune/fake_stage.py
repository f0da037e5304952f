"""A stand-in for ``posttrain <stage> --config FILE`` in the search's tests: it reads the trial's config,
writes eval records to metrics.jsonl and a summary.json as a training stage does, in well under a
second, with no torch.

The held-out figure is a known function of lr (best at lr = 10**-2.5), lowered by 0.1 per trial number
with FAKE_STAGE_WORSE_EACH_TRIAL=1 (so a pruner has later trials to stop); trial 1 fails as a NaN loss
does with FAKE_STAGE_FAIL_TRIAL=1. Each start appends a line to <output_dir>/starts. With
FAKE_STAGE_CHILD=1 it starts a child process that sleeps, as a worker a stage starts would. With
FAKE_STAGE_MODEL=DIR it copies that model into its output_dir, as the trial's model for an evaluate run.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import time

import yaml


def main() -> int:
    cfg = yaml.safe_load(open(sys.argv[sys.argv.index("--config") + 1]))
    out, lr = cfg["output_dir"], float(cfg["lr"])
    number = int(os.path.basename(out))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "starts"), "a") as fh:
        fh.write(f"{os.getpid()}\n")
    if os.environ.get("FAKE_STAGE_CHILD") == "1":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    final = 1.0 - (math.log10(lr) + 2.5) ** 2 / 10
    if os.environ.get("FAKE_STAGE_WORSE_EACH_TRIAL") == "1":
        final -= 0.1 * number
    steps, every = int(cfg["max_steps"]), int(cfg["eval_steps"])
    step_s = float(os.environ.get("FAKE_STAGE_STEP_S", "0.02"))
    with open(os.path.join(out, "metrics.jsonl"), "a") as log:
        for step in range(steps + 1):
            if step == 1 and number == 1 and os.environ.get("FAKE_STAGE_FAIL_TRIAL") == "1":
                print("error: dpo: step 1: loss or gradient is not finite (loss=nan)", file=sys.stderr)
                return 2
            if step % every == 0 or step == steps:
                record = {"step": step, "split": "eval", "logps/accuracy": final * step / steps}
                log.write(json.dumps(record) + "\n")
                log.flush()
            time.sleep(step_s)
    if os.environ.get("FAKE_STAGE_MODEL"):
        shutil.copytree(os.environ["FAKE_STAGE_MODEL"], out, dirs_exist_ok=True)
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump({"steps": steps, "eval": {"logps/accuracy": final, "loss": 0.5}}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
