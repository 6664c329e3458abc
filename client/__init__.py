"""Client side: controllers, EXP3, hysteresis episodes, the agent step, the ClientApp."""
