"""The placement-group names OpenRLHF's launcher imports; using any of them needs the real Ray."""


class PlacementGroup:
    """A type name only (OpenRLHF annotates with it); constructing one fails."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("ray stand-in: placement groups need the real Ray")


def placement_group(*args, **kwargs):
    raise RuntimeError("ray stand-in: placement_group() needs the real Ray")
