import pytest
import torch

from secureffm.data.colored_digits import CARDINALITIES, load_colored_digits
from secureffm.metrics.attribute_classifier import (
    attribute_accuracy,
    classifier_features,
    compositional_accuracy,
    train_attribute_classifier,
)
from secureffm.metrics.frechet import frechet_distance_features


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    train = load_colored_digits("train")
    model = train_attribute_classifier(train.x, train.labels, CARDINALITIES, progress=False)
    return model, train, load_colored_digits("test")


def test_held_out_accuracy_is_high(trained):
    model, _, test = trained
    digit, color = attribute_accuracy(model, test.x, test.labels)
    assert digit > 0.95
    assert color > 0.995


def test_compositional_accuracy_of_real_and_of_wrongly_labelled_images(trained):
    model, _, test = trained
    assert compositional_accuracy(model, test.x, test.labels) > 0.95
    for digit, color in [(0, 2), (4, 0), (7, 9), (8, 5)]:
        images = test.select(digit, color)
        assert compositional_accuracy(model, images, torch.tensor([digit, color])) > 0.9
        wrong_digit = torch.tensor([(digit + 1) % 10, color])
        wrong_color = torch.tensor([digit, (color + 1) % 10])
        assert compositional_accuracy(model, images, wrong_digit) < 0.1
        assert compositional_accuracy(model, images, wrong_color) < 0.05


# About 45-140 images per combination in 64 dimensions: singular covariances, the ridge path.
@pytest.mark.filterwarnings("ignore:Matrix is singular")
def test_features_tell_combinations_apart(trained):
    model, train, test = trained

    def feats(data, digit, color):
        return classifier_features(model, data.select(digit, color))

    same = frechet_distance_features(feats(train, 3, 0), feats(test, 3, 0))
    other_color = frechet_distance_features(feats(train, 3, 0), feats(test, 3, 5))
    other_digit = frechet_distance_features(feats(train, 3, 0), feats(test, 8, 0))
    assert feats(test, 3, 0).shape == (len(test.select(3, 0)), 64)
    assert other_color > 3 * same and other_digit > 3 * same


def test_training_is_seeded_and_leaves_the_global_generator_alone():
    data = load_colored_digits("test")
    state = torch.get_rng_state()
    a = train_attribute_classifier(data.x, data.labels, CARDINALITIES, epochs=1, seed=4,
                                   progress=False)
    b = train_attribute_classifier(data.x, data.labels, CARDINALITIES, epochs=1, seed=4,
                                   progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
