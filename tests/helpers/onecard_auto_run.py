"""zero_auto on one CPU process, where the one-card levers are candidates; each scenario writes what it saw.

    python tests/helpers/onecard_auto_run.py OUT_DIR

``search``: the trials (DeepSpeed and one-card) and the run of the winner; ``cached``: the same cache, its entry
replaced by ``onecard_step_in_backward``, so the run is handed over to the one-card strategy without a search;
``plain``: that preset by name on the same seed and data. Writes OUT_DIR/SCENARIO.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch

import lightning_zero  # noqa: F401  (registers the presets)
from lightning_zero import build_preset
from lightning_zero.auto.search import Candidate, candidate_to_dict
from lightning_zero.memory.states import Layout
from tests.helpers.fit_run import STEPS, Hungry
from tests.helpers.trainer import quiet_trainer

STEP_IN_BACKWARD = Layout("onecard", 0, optimizer_in_backward=True)


def fit(strategy: Any) -> dict[str, Any]:
    L.seed_everything(7)
    module = Hungry(batch_size=4)
    trainer = quiet_trainer(devices=1, strategy=strategy, max_steps=STEPS)
    trainer.fit(module)
    return {
        "trained_by": type(trainer.strategy).__name__,
        "search_reachable": getattr(trainer.strategy, "chosen_by", strategy) is strategy,
        "losses": module.losses,
        "weights": [p.detach().flatten().tolist() for p in module.parameters()],
        "process_group_left": torch.distributed.is_available() and torch.distributed.is_initialized(),
        "hooks_left": sum(len(p._post_accumulate_grad_hooks or {}) for p in module.parameters()),
    }


def auto(cache_file: Path) -> Any:
    zero = {"memory_budget_gib": 1, "max_trials": 1, "trial_steps": 1, "cache_file": str(cache_file)}
    return build_preset("zero_auto", **zero)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    cache = out / "cache.json"
    strategy = auto(cache)
    searched = fit(strategy)
    searched["tried"] = [(m.candidate.name, m.fits, m.samples_per_sec, m.reason) for m in strategy.trials]
    searched["chosen"] = strategy.chosen.name
    searched["run_samples_per_sec"] = strategy.run_against_trial.samples_per_sec
    (out / "search.json").write_text(json.dumps(searched))

    (key,) = json.loads(cache.read_text())
    entry = candidate_to_dict(
        Candidate(STEP_IN_BACKWARD, micro_batch=4, accumulation=1, pin_memory=False, bucket_size=0)
    )
    cache.write_text(json.dumps({key: entry}))
    strategy = auto(cache)
    cached = fit(strategy)
    cached.update(
        chosen=strategy.chosen.name, from_cache=strategy.from_cache, timed=strategy.run_against_trial is not None
    )
    (out / "cached.json").write_text(json.dumps(cached))

    (out / "plain.json").write_text(json.dumps(fit(build_preset("onecard_step_in_backward"))))


if __name__ == "__main__":
    main()
