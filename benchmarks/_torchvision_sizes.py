"""The image size a torchvision classification builder needs, shared by the benchmarks."""


def classification_size(name: str, small: int) -> int:
    """299 for Inception v3 (its stem), 224 for ViT, Swin and MaxViT (their fixed patch and
    window grids: the builders' image size), else `small`. Quantization builders
    (`quantized_inception_v3`) follow their float models."""
    base = name.removeprefix("quantized_")
    if base == "inception_v3":
        return 299
    if base.startswith(("vit", "swin", "maxvit")):
        return 224
    return small
