"""What the user writes, validated: scenarios, topologies, workloads and --set overrides
(every problem named with its file and YAML path). Pure, no root."""
