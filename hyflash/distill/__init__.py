"""On-policy distillation of small students: REOPOLD credit rules, baselines, tasks, rollouts, trainer."""
