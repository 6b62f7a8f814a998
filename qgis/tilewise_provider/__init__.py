"""tilewise's QGIS Processing provider (plugin entry point)."""


def classFactory(iface):  # noqa: N802 - QGIS's name
    from .plugin import TilewisePlugin

    return TilewisePlugin(iface)
