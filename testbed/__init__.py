"""AI-fabric testbed: emulate AI-training traffic on a leaf/spine or rail-optimised
Open vSwitch fabric in Mininet, in real fabric units."""

__version__ = "0.1.0"
