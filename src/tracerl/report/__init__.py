"""Reading runs and showing them: terminal views now, the HTML dashboard later."""

from tracerl.report.terminal import print_trajectory, trajectory_summary

__all__ = ["print_trajectory", "trajectory_summary"]
