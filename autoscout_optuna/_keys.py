"""Names of the per-trial attrs that samplers, the pruner and the CLI share.

User attrs (shown by optuna-dashboard and ``trials_dataframe``) carry decisions and reasons;
system attrs carry internal hand-offs between the orchestrator and its sub-samplers.
"""

# user attrs
ARM = "autoscout:arm"  # which sub-optimizer proposed this trial ("explore" / "refine" / ...)
REASON = "autoscout:reason"  # why, in words
FIDELITY = "autoscout:fidelity"  # "simulator" or "real": what the trial's value is
FAILURE_REASON = "failure_reason"  # timeout / oom / nan / crash / too_slow / no_metric / ...
MEMORY_USE = "memory_use"  # peak device memory over capacity, reported by the objective
TRUE_VALUE = "true_value"  # benchmarks only: the noiseless reference value
FIDELITY_REASON = "autoscout:fidelity_reason"  # why the pruner chose that fidelity
SIM_ERROR = "autoscout:sim_error"  # simulator calibrated relative error at decision time
SIM_ERROR_DETAIL = "autoscout:sim_error_detail"  # {n_pairs, discordance, kendall_tau, ...}
ESTIMATE = "autoscout:estimate"  # the simulator (or ensemble) estimate reported at step 0
SIMULATED = "autoscout:simulated"  # the raw analytic simulator output (ensemble input)
STUDY_OPTIONS = "autoscout:options"  # study user attr (CLI): the options its measurements need
DEFAULT_CONFIG = "autoscout:default_config"  # True: queued to run the study's default config
CONFIRMS = "autoscout:confirms"  # number of the trial whose config this queued trial re-runs
CONFIRM_SLOT = "autoscout:confirm_slot"  # which of its config's confirmation runs it is (1, 2...)
PINS_UNUSED = "autoscout:pins_unused"  # pinned knobs the trial's config holds another value of

# system attrs
STRUCTURE = "autoscout:structure"  # {param: value} structure a dense refinement must keep
WORKER = "autoscout:worker"  # {host, pid, start}: the process running the trial
ORPHANED = "autoscout:orphaned"  # True: failed because its worker died; samplers skip it

# user attrs (recovery)
RETRY_OF = "autoscout:retry_of"  # number of the orphaned trial this one re-runs
