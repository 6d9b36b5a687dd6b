"""What protorl makes of finished and running run directories.

    io         reading a run directory: its CSVs and result.json
    paths      the rule on symlinks: read and write only inside the run directory
    plots      one plot style and `plot_curves`, used by every figure below
    report     the summary and curves printed and drawn at the end of a run
    analyze    `protorl-analyze RUN_DIR`: the analyses logged during pre-training
    records    the phases of many runs as records: discovery, reading, deduplication
    stats      rliable's interval estimates and performance profiles
    aggregate  `protorl-aggregate PATH ...`: tables, curves and statistics over runs
"""
