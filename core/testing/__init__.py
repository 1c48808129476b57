"""Test kit shipped with the code: the network guard, and (later) scripted loopback peers."""
