"""What a run measured: metrics, summaries, traces and pictures."""
