"""A run folder back into numbers: pandas frames, training results, KPIs, the fidelity
guard, the HTML report. No root."""
