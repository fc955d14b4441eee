"""The scheduling-strategy name OpenRLHF imports; using it needs the real Ray."""


class PlacementGroupSchedulingStrategy:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("ray stand-in: scheduling strategies need the real Ray")
