"""An actor-critic (MorvanZhou's AC_CartPole, PyTorch port): the actor's loss multiplies by the
critic's `td_error` after the critic's step.

Source: https://github.com/ClownW/Reinforcement-learning-with-PyTorch/issues/1 ("RuntimeError about
AC_CartPole.py ... [torch.FloatTensor [20, 1]], which is output 0 of TBackward, is at version 2;
expected version 1 instead"), 8_Actor_Critic_Advantage/AC_CartPole.py. `Critic.learn` steps its
optimizer and returns `td_error`, still attached to the critic's graph, whose second Linear saved
its weight (the [20, 1] transpose); `Actor.learn`'s backward runs through that graph. In the
TensorFlow original `td_error` is fed to the actor as a constant: the intended program detaches it
(`exp_v = torch.mean(log_prob * td.detach())`). Two steps of fixed transitions instead of gym.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
GAMMA = 0.9
LR_A = 0.001
LR_C = 0.01
N_F, N_A = 4, 2


class ActorNet(nn.Module):
    def __init__(self, n_features, n_actions):
        super(ActorNet, self).__init__()
        self.l1 = nn.Linear(n_features, 20)
        self.acts_prob = nn.Linear(20, n_actions)

    def forward(self, x):
        x = F.relu(self.l1(x))
        return F.softmax(self.acts_prob(x), dim=1)


class CriticNet(nn.Module):
    def __init__(self, n_features):
        super(CriticNet, self).__init__()
        self.l1 = nn.Linear(n_features, 20)
        self.v = nn.Linear(20, 1)

    def forward(self, x):
        x = F.relu(self.l1(x))
        return self.v(x)  # <saved>


class Actor(object):
    def __init__(self, n_features, n_actions, lr=0.001):
        self.actor_net = ActorNet(n_features, n_actions)
        self.optimizer = torch.optim.Adam(self.actor_net.parameters(), lr=lr)

    def learn(self, s, a, td):
        s = torch.Tensor(s[np.newaxis, :])
        acts_prob = self.actor_net(s)
        log_prob = torch.log(acts_prob[0, a])
        exp_v = torch.mean(log_prob * td)
        loss = -exp_v
        self.optimizer.zero_grad()
        loss.backward()  # <backward>
        self.optimizer.step()
        return exp_v


class Critic(object):
    def __init__(self, n_features, lr=0.01):
        self.critic_net = CriticNet(n_features)
        self.optimizer = torch.optim.Adam(self.critic_net.parameters(), lr=lr)

    def learn(self, s, r, s_):
        s, s_ = torch.Tensor(s[np.newaxis, :]), torch.Tensor(s_[np.newaxis, :])
        v_ = self.critic_net(s_)
        v = self.critic_net(s)  # <saved-call>
        td_error = r + GAMMA * v_ - v
        loss = td_error ** 2
        self.optimizer.zero_grad()
        loss.backward(retain_graph=True)
        self.optimizer.step()  # <write>
        return td_error


actor = Actor(n_features=N_F, n_actions=N_A, lr=LR_A)
critic = Critic(n_features=N_F, lr=LR_C)
rng = np.random.RandomState(0)
s = rng.randn(N_F).astype(np.float32)
for t in range(2):
    a = t % N_A
    s_, r = rng.randn(N_F).astype(np.float32), 1.0
    td_error = critic.learn(s, r, s_)
    actor.learn(s, a, td_error)
    s = s_
result = {
    **{f"actor.{n}": p.detach().clone() for n, p in actor.actor_net.named_parameters()},
    **{f"critic.{n}": p.detach().clone() for n, p in critic.critic_net.named_parameters()},
}
