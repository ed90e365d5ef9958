"""Names of the per-trial attrs that samplers, the pruner and the CLI share.

User attrs (shown by optuna-dashboard and ``trials_dataframe``) carry decisions and reasons;
system attrs carry internal hand-offs between the orchestrator and its sub-samplers.
"""

# user attrs
ARM = "autoscout:arm"  # which sub-optimizer proposed this trial ("explore" / "refine" / ...)
REASON = "autoscout:reason"  # why, in words
FIDELITY = "autoscout:fidelity"  # "simulator" or "real": what the trial's value is
FAILURE_REASON = "failure_reason"  # timeout / oom / nan / crash / too_slow / no_metric / ...
TRUE_VALUE = "true_value"  # benchmarks only: the noiseless reference value

# system attrs
STRUCTURE = "autoscout:structure"  # {param: value} structure a dense refinement must keep
