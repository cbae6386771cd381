"""ImageNet-1k pretraining of PosMLP classifiers (``tools/pretrain.py``).

Built from timm's training components with the authors' published recipe
(:mod:`.recipe`); checkpoints are in the released format (:mod:`.checkpoints`).
"""
from .recipe import (POSMLP_S, POSMLP_T, RECIPES, SHAPES_DEMO, Recipe,
                     published_recipe, recipe_for)

__all__ = ['Recipe', 'RECIPES', 'POSMLP_T', 'POSMLP_S', 'SHAPES_DEMO',
           'published_recipe', 'recipe_for']
