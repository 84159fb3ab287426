"""The one-line boundary: errors of every layer print as `error: <message>` with exit status 2;
anything else (a bug) keeps its traceback."""
import pytest

from models.errors import ModelInputError
from objectives.interface import ObjectiveError
from pretrain.core import errors
from pretrain.data.tokenizers import MissingTokenError, TokenizerError


@pytest.mark.parametrize("error", [
    errors.UserError("config.data.path is empty"),
    errors.ConfigError("config.batch_size=3 is not divisible"),
    ModelInputError("top_p=0 must be in (0, 1]"),
    ObjectiveError("config.objective.z_loss=-1 must be >= 0"),
    TokenizerError("sentencepiece model not found: x.model"),
    MissingTokenError("tokenizer t has no [MASK] piece"),
])
def test_user_errors_of_every_layer_are_one_line(error, capsys, monkeypatch):
    monkeypatch.delenv("LMPRETRAIN_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        with errors.one_line_errors():
            raise error
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {error}\n"


def test_a_bug_is_not_hidden_as_a_user_error(monkeypatch):
    monkeypatch.delenv("LMPRETRAIN_TRACEBACK", raising=False)
    with pytest.raises(ValueError, match="a plain ValueError is a bug"):
        with errors.one_line_errors():
            raise ValueError("a plain ValueError is a bug")


def test_traceback_on_request(monkeypatch):
    monkeypatch.setenv("LMPRETRAIN_TRACEBACK", "1")
    with pytest.raises(ObjectiveError):
        with errors.one_line_errors():
            raise ObjectiveError("shown with its traceback")


def test_missing_token_is_a_lookup_error():
    """objectives.interface.eos_id_or_none catches LookupError without importing pretrain."""
    assert issubclass(MissingTokenError, LookupError) and issubclass(MissingTokenError, errors.UserError)
