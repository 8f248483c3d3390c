"""Every key of every training group is checked once, before anything is built (issue 20's
sweep: values that crashed behind Hydra's traceback hint, or were accepted and ran)."""

import pytest

from graphormer.cli.train import settings_from
from graphormer.errors import ConfigError

from helpers import compose_train

REFUSED = {
    "optim.lr=nan": "optim.lr=nan is not allowed: a finite number > 0",
    "optim.lr=-1": "optim.lr=-1 is not allowed",
    "optim.lr=0": "optim.lr=0 is not allowed",
    "optim.lr=inf": "optim.lr=inf is not allowed",
    "optim.weight_decay=-1": "optim.weight_decay=-1 is not allowed: a finite number >= 0",
    "optim.betas=[2,0.9]": "optim.betas=[2, 0.9] is not allowed: two numbers in [0, 1)",
    "optim.eps=0": "optim.eps=0 is not allowed",
    "optim.warmup_steps=-3": "optim.warmup_steps=-3 is not allowed: an integer >= 0 or null",
    "optim.warmup_ratio=2": "optim.warmup_ratio=2 is not allowed",
    "optim.total_steps=0": "optim.total_steps=0 is not allowed: an integer >= 1 or null",
    "optim.total_steps=-5": "optim.total_steps=-5 is not allowed",
    "optim.end_lr=1.0": "optim.end_lr=1.0 is not allowed: a learning rate <= the peak",
    "optim.fused=abc": "optim.fused='abc' is not allowed: true or false or null",
    "seed=-1": "seed=-1 is not allowed: an integer >= 0 and <= 4294967295",
    "seed=abc": "seed='abc' is not allowed",
    f"seed={2**70}": f"seed={2**70} is not allowed",
    "trainer.max_epochs=-2": "trainer.max_epochs=-2 is not allowed: an integer >= -1",
    "trainer.max_epochs=abc": "trainer.max_epochs='abc' is not allowed",
    "trainer.max_steps=-5": "trainer.max_steps=-5 is not allowed",
    "trainer.gradient_clip_val=nan": "trainer.gradient_clip_val=nan is not allowed",
    "trainer.gradient_clip_val=-1": "trainer.gradient_clip_val=-1 is not allowed",
    "trainer.check_val_every_n_epoch=0": "trainer.check_val_every_n_epoch=0 is not allowed",
    "trainer.val_check_interval=0": "trainer.val_check_interval=0 is not allowed",
    "+trainer.accumulate_grad_batches=0": "trainer.accumulate_grad_batches=0 is not allowed",
    "trainer.precision=garbage": "trainer.precision='garbage' is not allowed: one of auto",
    "trainer.devices=0": "trainer.devices=0 is not allowed",
    "trainer.strategy=foo": "trainer.strategy='foo' is not allowed",
    "normalize_targets=abc": "normalize_targets='abc' is not allowed: true or false",
    "model.num_heads=0": "model.num_heads=0 is not allowed: an integer >= 1",
    "model.dropout=nan": "model.dropout=nan is not allowed: a rate in [0, 1]",
    "model.hidden_dim=100000000": "model.hidden_dim=100000000 is not allowed: the network would",
    "model.atom_feature_dims=[0]": "model.atom_feature_dims=[0] is not allowed",
    "flag.m=-1": "flag.m=-1 is not allowed: an integer >= 0",
    "datamodule.batch_size=0": "datamodule.batch_size=0 is not allowed: an integer >= 1",
    "loss=hinge": "loss='hinge' is not allowed: one of auto, bce, ce, l1, mse",
}


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_a_bad_value_is_one_message_naming_key_value_and_what_is_allowed(tmp_path, override):
    cfg = compose_train([f"output_dir={tmp_path}", override])
    with pytest.raises(ConfigError) as caught:
        settings_from(cfg)
    message = str(caught.value)
    assert message.startswith(REFUSED[override]), message
    assert "\n" not in message


def test_the_defaults_and_every_recipe_are_accepted(tmp_path):
    from helpers import options

    # Recipes over the user's own file (issue #22's descriptor pre-training) need its path.
    # Fine-tuning recipes need the checkpoint they start from (refused without one).
    needs = {
        "descriptor_pretrain": ["dataset.path=smiles.csv"],
        "molhiv_finetune": ["pretrained=pre.ckpt"],
        "molpcba_finetune": ["pretrained=pre.ckpt"],
        "oc20_is2re": ["dataset.path=is2re/all"],  # OC20's folders
    }
    for name in options("experiment"):
        given = [f"output_dir={tmp_path}", f"experiment={name}", *needs.get(name, [])]
        settings = settings_from(compose_train(given))
        assert settings.optim.lr > 0
    settings = settings_from(compose_train([f"output_dir={tmp_path}"]))
    assert settings.trainer.precision == "32-true" and settings.seed == 42


def test_an_unknown_key_of_a_group_names_the_close_ones(tmp_path):
    cfg = compose_train([f"output_dir={tmp_path}", "+optim.learning_rate=1e-3"])
    with pytest.raises(ConfigError, match="optim.learning_rate does not exist"):
        settings_from(cfg)
    cfg = compose_train([f"output_dir={tmp_path}", "+trainer.max_epoch=3"])
    with pytest.raises(ConfigError, match="did you mean trainer.max_epochs"):
        settings_from(cfg)
