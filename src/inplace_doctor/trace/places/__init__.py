"""Where an op ran, named as the user would: user frames and stacks, module paths, where a module was
built, which forward line made an autograd node, entry points no hook sees.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `stacks`: Stacks: which frames are the user's, captured (Python and C++ stacks)
- `user_files`: Which files are the user's
- `user_names`: Names the user wrote for a module the tracer meets outside any known root
- `modules`: The module path active at each op, named like `model.named_modules()` does
- `origins`: Where a module with an `inplace` flag was constructed
- `nodes`: Where each autograd node was created, so an error raised inside backward names a forward
  line
- `entry_points`: Calls into a model that no forward hook sees
"""
