"""The run plan as pure data: fabric, routes, queues, PFC decisions, the training schedule,
what the physics allows. No root, no side effects."""
