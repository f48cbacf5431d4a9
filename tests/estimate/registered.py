"""The test factories as an operator would register them (`fleetprof models add`), without importing them (or
torch): `nope` stands for a registered name its module does not have."""

REGISTERED = frozenset(f"tests.estimate.factories:{name}" for name in (
    "mlp", "raising", "sleeping", "not_a_module", "sandbox_probe", "nope"))
