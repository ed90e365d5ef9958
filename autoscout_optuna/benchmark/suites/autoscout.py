"""AutoScoutSampler against Optuna's samplers, its ablations, and its overhead.

Suites:

- ``autoscout``: AutoScoutSampler vs random, TPE, GP and CMA-ES on the reference studies, plus
  the ablations the paper reports (fixed alternation instead of the bandit, no dense optimizer,
  no feature prioritization, naive reward instead of difference-in-differences), blind
  start-up coverage instead of MCTS's, and the opt-in variants (neighbour arm, memory model,
  the study's memory estimate).
- ``autoscout-long``: AutoScout, AutoScout without the model arm and with the study's memory
  estimate, MCTSSampler alone, TPE,
  CMA-ES and random search with ``LONG_TRIALS`` trials, for the trials to 99 % that 100
  trials censor.
- ``autoscout-overhead``: sampler milliseconds per trial on a cheap 15-knob conditional space,
  up to 5,000 trials (AutoScout) and 1,000 (TPE, whose cost per trial grows with history), read
  from ``sampler_ms`` at trials ~100, ~1,000 and ~5,000 (wall clock).
- :func:`measure_overhead`: the same in CPU time of this process, split into MCTS,
  coordinate descent and the orchestrator's own share
  (``python -m autoscout_optuna.benchmark.suites.autoscout autoscout 5000``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from autoscout_optuna._failure import Infeasible
from autoscout_optuna._objective import reference_objective
from autoscout_optuna._study_definition import StudyDefinition
from autoscout_optuna.benchmark._harness import Contender, Suite, TimedSampler
from autoscout_optuna.benchmark.suites import baselines, mcts
from autoscout_optuna.samplers import AutoScoutSampler

# AutoScout's contenders by name, as constructor options: the defaults, the ablations (a part
# taken out) and the variants (an opt-in added).
AUTOSCOUT_OPTIONS: dict[str, dict[str, Any]] = {
    "autoscout": {},
    "ablation: alternation": {"policy": "alternate"},
    "ablation: no dense optimizer": {"dense_optimizer": False},
    "ablation: no feature prioritization": {"feature_prioritization": False},
    "ablation: naive reward": {"reward": "naive"},
    "variant: + neighbour arm": {"neighbour_arm": True},
    "ablation: no model arm": {"model_arm": False},
    "variant: model arm once the local searches are spent": {"model_after": 30},
    "ablation: blind start-up coverage": {"startup": "coverage"},
    "variant: memory model": {"memory_model": True},
}


# Long enough for TPE's trials to 95 % to be seen on two of the three studies. 40 seeds, as the
# 100-trial suite: on serving, TPE's seeds 0-9 reach 0.997 of the optimum at 200 trials in the
# median, its seeds 0-79 0.868 (33 minutes on 2 cores, 2026-12-02)
LONG_TRIALS = 500
LONG_SEEDS = 40


def make_autoscout(seed: int, **options: Any) -> optuna.samplers.BaseSampler:
    return AutoScoutSampler(seed=seed, **options)


MEMORY_ESTIMATE = "variant: memory estimate"


def make_autoscout_with_estimate(
    seed: int, definition: StudyDefinition
) -> optuna.samplers.BaseSampler:
    """AutoScout given the study's memory formula (None where the study has none: then it is
    the default sampler, trial for trial)."""
    return AutoScoutSampler(seed=seed, memory_estimate=definition.memory_estimate)


FROM_EXPERT = " from the expert config"


def from_expert(contenders: list[Contender]) -> list[Contender]:
    """The same contenders, each starting with the study's expert config as trial 0.

    Users rarely start from nothing: they enqueue the config they run today. Every sampler
    gets that first trial, so the comparison stays fair, and the table says how much of what
    each sampler finds is beyond the expert's own config.
    """
    return [dataclasses.replace(c, name=c.name + FROM_EXPERT, start_from_default=True)
            for c in contenders]


def plot_groups(contenders: list[Contender]) -> list[tuple[str, list[str]]]:
    """The plot's rows: AutoScout against Optuna's samplers from scratch, the same from the
    expert config, and AutoScout's ablations and variants (each row with AutoScout first)."""
    names = [c.name for c in contenders]
    baseline_names = {c.name for c in baselines.contenders()}
    expert = [n for n in names if n.endswith(FROM_EXPERT)]
    ours = [n for n in names if n not in baseline_names and n not in expert]
    # baselines also run from the expert config first, so that a sampler has the same colour
    # in both rows
    twinned = sorted((n for n in names if n in baseline_names),
                     key=lambda n: n + FROM_EXPERT not in expert)
    groups = [
        ("from scratch: AutoScout and Optuna's samplers", [ours[0], *twinned]),
        ("from the expert config", expert),
        ("AutoScout's ablations and variants", ours),
    ]
    return [(title, members) for title, members in groups if members]


def autoscout_contenders() -> list[Contender]:
    """AutoScout, its ablations and variants (one the sub-samplers cannot express is left
    out)."""
    contenders = []
    for name, options in AUTOSCOUT_OPTIONS.items():
        try:
            make_autoscout(0, **options)
        except ValueError:
            continue  # e.g. an MCTSSampler without a feature-prioritization switch
        contenders.append(Contender(name, functools.partial(make_autoscout, **options)))
    contenders.append(Contender(MEMORY_ESTIMATE, make_autoscout_with_estimate,
                                sampler_reads_study=True))
    return contenders


# -- the overhead space: 15 knobs, 3 branches, cheap to evaluate -----------------------------


def overhead_suggest(trial: Any) -> dict[str, Any]:
    """15 knobs: 5 shared, 4 + 3 + 3 under three branches of ``backend``."""
    config: dict[str, Any] = {
        "backend": trial.suggest_categorical("backend", ["gemm", "flash", "fused"]),
        "batch": trial.suggest_categorical("batch", [1, 2, 4, 8, 16]),
        "workers": trial.suggest_int("workers", 1, 8),
        "lr": trial.suggest_float("lr", 1e-5, 1e-1, log=True),
        "buffer_mb": trial.suggest_float("buffer_mb", 1.0, 1024.0, log=True),
    }
    if config["backend"] == "gemm":
        config["tile"] = trial.suggest_categorical("tile", [64, 128, 256])
        config["split_k"] = trial.suggest_int("split_k", 1, 16)
        config["stages"] = trial.suggest_int("stages", 1, 6)
        config["gemm_alpha"] = trial.suggest_float("gemm_alpha", 0.0, 1.0)
    elif config["backend"] == "flash":
        config["block"] = trial.suggest_categorical("block", [32, 64, 128])
        config["causal_skip"] = trial.suggest_categorical("causal_skip", [True, False])
        config["flash_beta"] = trial.suggest_float("flash_beta", 0.0, 1.0)
    else:
        config["fusion"] = trial.suggest_categorical("fusion", ["none", "partial", "full"])
        config["sms"] = trial.suggest_int("sms", 1, 132)
        config["fused_gamma"] = trial.suggest_float("fused_gamma", 0.0, 1.0)
    return config


def overhead_measure(config: dict[str, Any], rng: Any = None) -> float:
    """A smooth bowl per branch, with one infeasible corner (for the FAIL path)."""
    if config["batch"] == 16 and config["workers"] == 8:
        raise Infeasible("oom", "batch 16 with 8 workers")
    value = 1.0 + math.log2(config["batch"]) + (math.log10(config["lr"]) + 3.0) ** 2
    value += (math.log2(config["buffer_mb"]) - 6.0) ** 2 / 10.0 + abs(config["workers"] - 4)
    for key in ("gemm_alpha", "flash_beta", "fused_gamma"):
        if key in config:
            value += 4.0 * (config[key] - 0.3) ** 2
    if rng is not None:
        value *= float(rng.lognormal(0.0, 0.01))
    return value


def overhead_definition() -> StudyDefinition:
    return StudyDefinition(
        name="overhead_15_knobs", direction="minimize", metric="arbitrary units",
        suggest=overhead_suggest, measure=overhead_measure,
        description="Cheap synthetic 15-knob conditional space for sampler overhead.",
    )


def suites(quick: bool = False) -> list[Suite]:
    definitions, labels = baselines.reference_studies()
    # MCTSSampler alone (every trial explores): the reference for what the refine arm and the
    # start-up coverage cost on studies whose dense knobs barely matter
    mcts_alone = Contender("variant: MCTSSampler alone", mcts.make_mcts)
    contenders = autoscout_contenders() + [mcts_alone] + baselines.contenders()
    expert_start = from_expert([contenders[0], *baselines.contenders()])
    # GP is left out of the long runs (its per-trial cost grows past seconds by 500 trials);
    # the model arm's ablation is in: what the arm is worth past 100 trials
    no_model = next(c for c in contenders if c.name == "ablation: no model arm")
    estimating = next(c for c in contenders if c.name == MEMORY_ESTIMATE)
    long_contenders = [contenders[0], no_model, estimating, mcts_alone] + [
        c for c in baselines.contenders() if c.name != "gp"]
    # from the expert config too: its trials to 99 %, which 100 trials censor
    long_contenders += from_expert([c for c in long_contenders if c.name in ("autoscout", "tpe")])
    overhead = overhead_definition()
    if quick:
        return [
            Suite(name="autoscout", definitions=definitions, labels=labels,
                  contenders=contenders, n_trials=12, n_seeds=2, budgets=(5, 10),
                  description="Smoke-test run (--quick)."),
            Suite(name="autoscout-long", definitions=definitions, labels=labels,
                  contenders=long_contenders, n_trials=12, n_seeds=1, budgets=(5, 12),
                  description="Smoke-test run (--quick)."),
            Suite(name="autoscout-overhead", definitions=[overhead],
                  contenders=[autoscout_contenders()[0],
                              Contender("tpe", baselines.make_tpe)],
                  n_trials=30, n_seeds=1, budgets=(10, 30),
                  description="Smoke-test run (--quick)."),
        ]
    return [
        Suite(
            name="autoscout",
            definitions=definitions,
            labels=labels,
            contenders=contenders + expert_start,
            plot_groups=plot_groups(contenders + expert_start),
            n_trials=100,
            n_seeds=40,
            budgets=(10, 20, 50, 100),
            description=(
                "AutoScoutSampler (defaults) against Optuna's samplers with their defaults, and "
                "four ablations of AutoScout: fixed alternation of the arms instead of the "
                "bandit, no dense optimizer (dense knobs keep the incumbent's values), no "
                "feature prioritization in MCTS, and a naive reward (difference to the "
                "incumbent) instead of difference-in-differences; no model arm (a structure "
                "proposed by a log-additive model of all scores, a bandit arm from the first "
                "incumbent on, without a floor share) and that arm opened only once the "
                "structure search and the refinements are spent (the default until session "
                "26); the "
                "optional neighbour arm (one structural change of the incumbent); start-up "
                "coverage blind to failures (each structural param its least-tried value) "
                "instead of MCTS's; the optional memory model (P(out of memory) also from "
                "the peak memory the training studies report); the study's memory formula "
                "as `memory_estimate` (the training studies: Megatron-LM's theoretical "
                "memory, calibrated on the reported peaks; serving has none and runs the "
                "defaults); and MCTSSampler alone. "
                "AutoScout and every baseline "
                "again from the expert config (the study's default config run as trial 0, as "
                "a user would enqueue the config they run today). "
                "Scored on the noiseless "
                f"reference value; GP runs {baselines.GP_SEEDS} seeds (its per-trial cost)."
            ),
            extra_report=write_paired_report,
            rescore_report=write_paired_report,
        ),
        Suite(
            name="autoscout-long",
            definitions=definitions,
            labels=labels,
            contenders=long_contenders,
            plot_groups=plot_groups(long_contenders),
            n_trials=LONG_TRIALS,
            n_seeds=LONG_SEEDS,
            budgets=(20, 50, 100, 200, LONG_TRIALS),
            description=(
                "AutoScoutSampler, the same without its model arm and with the study's memory "
                "estimate, MCTSSampler alone and "
                f"Optuna's TPE, CMA-ES and random search with {LONG_TRIALS} trials: trials to "
                "95 % and 99 % of the optimum "
                "where the 100-trial suite censors them (the issue's 'at most a tenth of "
                "TPE's trials'), and whether a search keeps improving after 100 trials. "
                "AutoScout and TPE also from the expert config (the study's default config "
                "as trial 0)."
            ),
        ),
        Suite(
            name="autoscout-overhead",
            definitions=[overhead],
            contenders=[autoscout_contenders()[0]],
            n_trials=5000,
            n_seeds=1,
            budgets=(100, 1000, 5000),
            description=(
                "Sampler time per trial (column sampler_ms of trials.csv) on a cheap 15-knob "
                "conditional space, AutoScoutSampler up to 5,000 trials."
            ),
        ),
        Suite(
            name="autoscout-overhead-tpe",
            definitions=[overhead],
            contenders=[Contender("tpe", baselines.make_tpe)],
            n_trials=1000,
            n_seeds=1,
            budgets=(100, 1000),
            description=(
                "TPE on the same 15-knob space, up to 1,000 trials (at 5,000 its per-trial "
                "cost makes the run too long for `make bench` on 2 cores)."
            ),
        ),
    ]


def write_paired_report(directory: Path) -> Path | None:
    """``paired.md``: every contender against AutoScout's defaults, seed for seed; and the
    contenders that start from the expert config against AutoScout started from it. None (and
    a note on stderr) where the run has no AutoScout rows to pair against.

    The summary's medians differ by what each seed set happens to give; paired per seed, an
    ablation's cost has an interval (``autoscout_optuna.benchmark.paired``).
    """
    import pandas as pd

    from autoscout_optuna.benchmark.paired import markdown, paired_against

    directory = Path(directory)
    trials = pd.read_csv(directory / "trials.csv")
    expert_start = trials["contender"].str.endswith(FROM_EXPERT)
    reference = "autoscout" + FROM_EXPERT
    # A baseline that starts from the expert config is judged against AutoScout started alike.
    from_scratch = trials[~expert_start | (trials["contender"] == reference)]
    if not (from_scratch["contender"] == "autoscout").any():
        # e.g. `--contender tpe --out NEW_DIR`: trials.csv is written, there is nothing to pair
        print(f"{directory / 'paired.md'} not written: the run has no 'autoscout' rows to pair "
              "the others against", file=sys.stderr)
        return None
    table = paired_against(from_scratch, "autoscout", budgets=(20, 50, 100))
    text = (
        "# autoscout: every contender against AutoScout's defaults, seed for seed\n\n"
        "Written from `trials.csv` by `python -m autoscout_optuna.benchmark.paired "
        "trials.csv --against autoscout` (also after each run of the suite). Per study and "
        "budget: the seeds both ran, median best/optimum of AutoScout -> the contender, the "
        "mean per-seed difference (contender - AutoScout) with its 90 % interval, seeds where "
        "the contender is better / worse by more than 0.001, seeds at 99 % of the optimum, and "
        "FAIL trials per seed after the first 20.\n\n" + markdown(table)
    )
    baselines_from_expert = set(trials.loc[expert_start, "contender"]) - {reference}
    if baselines_from_expert and (trials["contender"] == reference).any():
        table = paired_against(trials[expert_start], reference, budgets=(20, 50, 100))
        text += (
            f"\n## From the expert config: every baseline against {reference}\n\n"
            "Each run's trial 0 is the study's expert config; the same columns as above, with "
            f"{reference} as the reference.\n\n" + markdown(table)
        )
    path = directory / "paired.md"
    path.write_text(text)
    return path


# -- CPU-time overhead (the harness times wall clock, which other load on a shared machine
# inflates; this counts only this process's CPU time) ------------------------------------------


class _CpuTimedSampler(TimedSampler):
    def _timed(self, trial_number: int, fn: Any, *args: Any) -> Any:
        start = time.process_time()
        try:
            return fn(*args)
        finally:
            self.seconds_by_trial[trial_number] += time.process_time() - start


def measure_overhead(
    contender: str, n_trials: int, checkpoints: tuple[int, ...] = (100, 1000, 2000, 5000),
    seed: int = 0,
) -> dict[int, dict[str, float]]:
    """Sampler CPU ms/trial (mean of the 50 trials before each checkpoint) on the 15-knob space.

    For ``"autoscout"`` (and ``"autoscout+model"``, since session 26 the same) the MCTS and
    coordinate-descent shares are reported too, the rest is the orchestrator's own (history
    digest, bandit, plan, and the model arm's proposals). ``seed`` seeds the sampler and the
    measurement noise: the cost depends on the path a run takes (e.g. whether it has met the
    space's infeasible corner, after which every MCTS plan fits its feasibility model).
    """
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    parts: dict[str, _CpuTimedSampler] = {}
    if contender in ("autoscout", "autoscout+model"):
        inner = make_autoscout(seed, **({"model_after": 0} if contender == "autoscout+model"
                                        else {}))
        parts = {"mcts": _CpuTimedSampler(inner._explore), "cd": _CpuTimedSampler(inner._refine)}
        inner._explore, inner._refine = parts["mcts"], parts["cd"]
    else:
        inner = baselines.make_tpe(seed)
    sampler = _CpuTimedSampler(inner)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    objective = reference_objective(overhead_definition(), noise_seed=seed)
    study.optimize(objective, n_trials=n_trials, catch=(Infeasible,))
    result = {}
    for point in (p for p in checkpoints if p <= n_trials):
        numbers = range(max(0, point - 50), point)
        row = {"total": _mean_ms(sampler, numbers)}
        row.update({name: _mean_ms(part, numbers) for name, part in parts.items()})
        if parts:
            row["orchestrator"] = row["total"] - sum(row[name] for name in parts)
        result[point] = row
    return result


def _mean_ms(sampler: TimedSampler, numbers: range) -> float:
    return 1000.0 * sum(sampler.seconds_by_trial.get(i, 0.0) for i in numbers) / len(numbers)


if __name__ == "__main__":  # python -m autoscout_optuna.benchmark.suites.autoscout autoscout 5000 0
    import sys

    which, count = sys.argv[1], int(sys.argv[2])
    run_seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    for point, row in measure_overhead(which, count, seed=run_seed).items():
        print(which, point, {k: round(v, 2) for k, v in row.items()})
