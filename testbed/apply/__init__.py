"""What touches the machine: the fabric, queues, the PFC process, the agents' and the
controller's launch, reachability, captures, clean-up, capabilities. Needs root."""
