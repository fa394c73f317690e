"""A real timm model with gradient checkpointing on (`set_grad_checkpointing()`, non-reentrant, as timm
defaults), dropout and drop-path active, trained two steps: every recompute replays the forward."""
import timm
import torch


def main() -> None:
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=10,
        drop_rate=0.1, proj_drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.1,
    )
    model.set_grad_checkpointing(True)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        x, target = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
        loss = torch.nn.functional.cross_entropy(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


main()
