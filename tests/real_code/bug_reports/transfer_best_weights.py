"""PyTorch's transfer-learning tutorial (beginner_source/transfer_learning_tutorial.py, 2017): the
"best" weights kept with `best_model_wts = model.state_dict()`.

Source: https://github.com/pytorch/tutorials/pull/188 ("Fixed deep copying model.state_dict()":
"Otherwise best_model_wts changes always to last epoch's state"). `state_dict()` returns aliases
of the parameters: every later `optimizer.step()` rewrites the "best" weights too, and the final
`model.load_state_dict(best_model_wts)` restores the last epoch's weights, not the best epoch's.
Nothing raises. The upstream fix: `best_model_wts = copy.deepcopy(model.state_dict())`.

Cut down to a small CNN on fixed random images, three epochs; the validation accuracy is best
after the second of three epochs (0.625; 0.375 after the third), so the intended program
restores the second epoch's weights.
"""
import copy

import torch
from torch import nn
from torch.optim import lr_scheduler

torch.manual_seed(0)

inputs = {"train": torch.randn(16, 3, 8, 8), "val": torch.randn(8, 3, 8, 8)}
labels = {"train": torch.randint(0, 2, (16,)), "val": torch.randint(0, 2, (8,))}


def train_model(model, criterion, optimizer, scheduler, num_epochs=3):
    best_model_wts = model.state_dict()
    best_acc = 0.0
    for epoch in range(num_epochs):
        for phase in ["train", "val"]:
            model.train(phase == "train")
            running_corrects = 0
            for start in range(0, len(inputs[phase]), 4):
                x, y = inputs[phase][start:start + 4], labels[phase][start:start + 4]
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(x)
                    _, preds = torch.max(outputs, 1)
                    loss = criterion(outputs, y)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()  # <write>
                running_corrects += int(torch.sum(preds == y))
            if phase == "train":
                scheduler.step()
            epoch_acc = running_corrects / len(inputs[phase])
            if phase == "val" and epoch_acc > best_acc:
                best_acc = epoch_acc
                best_model_wts = model.state_dict()  # <handout>
    model.load_state_dict(best_model_wts)  # <read>
    return model, best_acc


model_ft = nn.Sequential(
    nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)
)
optimizer_ft = torch.optim.SGD(model_ft.parameters(), lr=0.5, momentum=0.9)
exp_lr_scheduler = lr_scheduler.StepLR(optimizer_ft, step_size=7, gamma=0.1)
model_ft, best = train_model(model_ft, nn.CrossEntropyLoss(), optimizer_ft, exp_lr_scheduler)
result = {"best_acc": torch.tensor(best), **{k: v.detach().clone() for k, v in model_ft.state_dict().items()}}
