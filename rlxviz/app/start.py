"""The "start here" strip the page opens on: three clicks (step through the passes, break a layer, ask why) and a
drop zone for one's own model. Each click does the step itself and says what to look at next.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import panel as pn
import param
from panel.viewable import Viewer

from ..passes.trace import PassStep
from ..passes.why.text import layer_fix_words
from ..session import SessionError
from ..viz.styles import match_frames
from .state import SHAPE_VARIANT, VARIANT_LABELS, AppState
from .text import html_text
from .views import COLLAPSED, FOCUS

BREAK_VARIANT = "dead_h1_user"
"""The variant the second click applies: one more user of the attention output h1 (a third: the layer fusion's guard
needs exactly 2, and refuses it; the Why tab then names that guard). Its reader reaches no output (dead code), so the
refusal is a near-miss with a checked fix in the model (dead-code elimination); a reader the model returns
(`extra_h1_user`) leaves the layer fused only as far as legal (`passes.why.facts.illegal_here`), no break to ask
about."""
BREAK_WORDS = ("Layer {layer} (the sidebar's Layer to break) now has a dead extra reader of its attention output; the "
               "banner below names the guard that refused it. Removing it (dead_code_elimination) lets it fuse.")
"""What ② says once it broke a layer (`{layer}`): the refusal, and that it is no verdict on the layer: the reader
reaches no output, and dead-code elimination before the layer pass (the refusal's compiler fix; the pipeline runs it
only after) makes the fusion legal. Three lines at most in the strip's 380 px (`NOTE_CSS`), as the line it replaced
("so it must stay unfused", which it is not)."""
BREAK_LAYER = 1
"""The layer the sidebar's "Layer to break" starts at when the strip is shown (layer 0 when the model has only one);
the second click breaks the layer that box shows (`AppState.variant_layer`: one field, so the box and ② agree)."""

PASSES_DO = "most shrink the graph, some make more, smaller nodes"
"""What ① shows, true of every pass (`fuse_shared_input_matmul` grows it: one matmul and its slices for several)."""
STEPS = (f"Three clicks: ① step through the passes ({PASSES_DO}), ② break a layer, ③ ask why it did not fuse. Or "
         "drop an .onnx at the right.")
"""The strip's first line: two lines of the strip's text at 1280 px with the sidebar folded (it took three, and the
clamp cut it at "Or drop yo…")."""
STEPS_NO_BREAK = (f"Two clicks for this model: ① step through the passes ({PASSES_DO}), ③ ask why a layer did or did "
                  "not fuse (② breaks a layer of a BERT preset or checkpoint only). Or drop an .onnx at the right.")
"""The line where ② does not apply (an ONNX export, IR text, a decoder): the steps, not an error. Why ② is off is
said when it is clicked (every load of such a model said it unasked)."""

NOTE_CSS = """
:host { flex: 1 1 380px; min-width: min(380px, 100%); }
.rv-note-line { font-size: 12px; line-height: 16px; overflow-wrap: anywhere; }
"""
"""The strip's text, whole (at 1280 px beside an open sidebar it was cut to its first words, the rest only in the
tooltip): it wraps, and it takes a line of its own below the buttons (`STEPS_CSS`) when fewer than 380 px are left
beside them, so it is never squeezed into a column of many lines (a text left to wrap in 121 px made the strip 157
px tall and pushed the graph panes below a laptop's fold). 380 px: the line after ① or ② in three lines at most."""
STEPS_CSS = """
:host { flex-wrap: wrap; align-items: center; align-content: center; row-gap: 2px; }
"""
"""The title, the three buttons and the text: one line where the text keeps 380 px beside them, else the text on a
line of its own below the buttons (the drop zone and ✕ stay at the strip's right: before ① the buttons and the text
fit in the drop zone's height)."""


def note_html(parts: list[tuple[str, bool]]) -> str:
    """The strip's line as HTML from (text, bold) pieces: each piece escaped (`html_text`: model and version names
    are data), the whole text, plain, as its tooltip."""
    plain = "".join(t for t, _ in parts)
    body = "".join(f"<b>{html_text(t)}</b>" if bold else html_text(t) for t, bold in parts)
    return f'<div class="rv-note-line" title="{html_text(plain)}">{body}</div>'


PASSES_PENDING = "① shows the first pass as soon as the passes have run on this model…"
"""The line after ① clicked while the model's passes were still running: the click is kept, not lost."""


class StartHere(Viewer):
    """Three buttons that do the first three steps, a line saying what each did, and a model drop zone.

    Args:
        state: the session's state.
        show_why: opens the Why tab (the page's tabs belong to the template).
        dropper: the drop zone to place at the right (`ModelControls.make_dropper`), or None.
    """

    state = param.ClassSelector(class_=AppState)

    def __init__(self, show_why: Callable[[], None], dropper: pn.viewable.Viewable | None = None,
                 **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.show_why = show_why
        fixed = dict(color="primary", sizing_mode="fixed", height=34, align="center")
        # widths: beside an open sidebar at 1280 px the strip is 866 px wide; the buttons, the drop zone and ✕ leave
        # the line 100 px at least on one row (with 220 + 140 + 110 px buttons and a 240 px zone it got 0)
        self.step = pn.widgets.Button(label="① Step passes ▶", width=140, **fixed, css_classes=["rv-start-step"])
        self.brk = pn.widgets.Button(label="② Break a layer", width=140, **fixed, css_classes=["rv-start-break"])
        self.why = pn.widgets.Button(label="③ Ask why", width=96, **fixed, css_classes=["rv-start-why"])
        # no tooltips: a button's popover lay over its neighbour and took its click
        self.hide = pn.widgets.Button(label="✕", color="light", width=36, height=34, sizing_mode="fixed",
                                      align="center", css_classes=["rv-start-hide"])
        # its width: 380 px beside the buttons, else a line of its own below them (NOTE_CSS, STEPS_CSS)
        self.note = pn.pane.HTML(note_html([(STEPS, False)]), css_classes=["rv-start-note"], margin=(0, 8),
                                 align="center", sizing_mode="stretch_width", stylesheets=[NOTE_CSS])
        self._mode, self._parts = "steps", [(STEPS, False)]  # what the line says (`_say`)
        self._step_pending = False  # ① clicked while the passes were still running: it steps once they have
        self._reason_said = ""  # why ② is off, said when it was clicked (`break_layer`)
        self._jump: tuple[int, object] | None = None  # (the layer ② broke, the trace shown when it was clicked)
        self._model_name = ""
        self._about: tuple = ()  # the (model, pipeline) keys the line of ② or ③ describes (`_follow`)
        self._held: tuple[list[tuple[str, bool]], str] | None = None  # that line, said again when they are back
        self.title = pn.pane.Markdown("**Start here**", margin=(0, 2, 0, 8), align="center", width=84, height=24,
                                      sizing_mode="fixed", css_classes=["rv-start-title"])
        self.step.on_click(lambda e: self.next_version())
        self.brk.on_click(lambda e: self.break_layer())
        self.why.on_click(lambda e: self.ask_why())
        self.dropper = dropper
        # the folded strip's way to the drop zone: the zone is taller than the folded row, so a button in the row
        # unfolds it (once folded, the zone was gone, though "drop your own .onnx at the right" was still said)
        self.drop_btn = pn.widgets.Button(label="⤓ drop .onnx…", color="light", width=110, height=34,
                                          sizing_mode="fixed", align="center", visible=False,
                                          css_classes=["rv-start-drop"])
        self.drop_btn.on_click(lambda e: self.show_drop())
        drop = [self.drop_btn, dropper] if dropper is not None else []
        self.steps_row = pn.FlexBox(self.title, self.step, self.brk, self.why, self.note, sizing_mode="stretch_width",
                                    css_classes=["rv-start-steps"], stylesheets=[STEPS_CSS], align="center")
        self.strip = pn.Row(self.steps_row, *drop, self.hide, sizing_mode="stretch_width", css_classes=["rv-start"],
                            styles={"background": "#e3f2fd", "border-radius": "6px"})
        self.dismissed = False
        self._tab_shows = True  # the tab shown is one the strip's steps use (`show_on`)
        self.folded = False  # `fold`: the title and the drop zone hidden once a step is used
        self.hide.on_click(lambda e: self.dismiss())
        # the way back once ✕ dismissed the strip (the page's header holds it): a lecturer who closed it mid-lecture
        # had ① ② ③ back only by reloading the page
        self.back = pn.widgets.Button(label="① ② ③ Start here", color="light", width=140, height=30,
                                      sizing_mode="fixed", align="center", visible=False, css_classes=["rv-start-back"])
        self.back.on_click(lambda e: self.restore())
        s.param.watch(self._enable, ["model", "source", "preset", "busy"])  # busy: a refused load ends
        # busy: a run's verdicts hold once its job ends (`_say_state`)
        s.param.watch(self._follow, ["version", "trace", "hide_unchanged", "variant", "variant_layer", "busy"])
        self._start_layer()
        self._enable()

    def _start_layer(self) -> None:
        """Put "Layer to break" at `BREAK_LAYER` when no variant is on and the box is at its first value, 0 (it said
        0 while ② broke layer 1): no reload, the model as built does not depend on it (`Runs.move_layer_quietly`)."""
        s = self.state
        hi = s.param.variant_layer.bounds[1]
        if s.variant == "none" and s.variant_layer == 0 and (hi is None or BREAK_LAYER <= hi):
            s.runs.move_layer_quietly(BREAK_LAYER)

    def _keys(self) -> tuple:
        """What the lines of ② and ③ describe: the model asked for (variant and its layer included) and the
        pipeline."""
        s = self.state
        return (s.model_key(), s.pipeline_key())

    def _unavailable(self) -> str:
        """Why ② does not apply to the model shown ('' when it does): after a refused load (IR text that does not
        parse) the model shown is still the last one, and ② breaks its layer (it stayed disabled, judged on the IR
        text that never loaded)."""
        s = self.state
        back = s.shown_source()
        if back is not None:
            return s.variant_unavailable(BREAK_VARIANT, back[0], str(back[1].get("preset", "")) or None)
        shown = s.runs._model_key
        if s.model is not None and not s.busy and shown[:1] == ("ir",) and s.source != "ir":
            # the model shown came from IR text and a path or upload asked for since was refused or failed: ② is
            # judged on the IR graph shown (a refused path made it "small is not a BERT encoder", judged as a
            # checkpoint that never loaded)
            return s.variant_unavailable(BREAK_VARIANT, "ir")
        return s.variant_unavailable(BREAK_VARIANT)

    def steps(self) -> str:
        """The line of the steps: `STEPS`, or `STEPS_NO_BREAK` while ② does not apply (`brk.disabled`)."""
        return STEPS_NO_BREAK if self.brk.disabled else STEPS

    def _enable(self, *_: object) -> None:
        """② on or off for the model shown; the steps line follows. Why ② is off is said only when it is clicked
        (`break_layer`), and only until the model or its source changes (a refusal outlived the next load)."""
        reason = self._unavailable()
        self.brk.disabled = bool(reason)
        if self._mode == "steps" or (self._mode == "reason" and self._reason_said != reason):
            self._say([(self.steps(), False)], "steps")

    def _say(self, parts: list[tuple[str, bool]], mode: str) -> None:
        self._mode, self._parts = mode, parts
        self.note.object = note_html(parts)

    def _follow(self, *_: object) -> None:
        """Keep the line true to what is shown: after ① it names the model and version now shown (a new model or
        another version chosen elsewhere); the lines of ② and ③ belong to their model, so a new model's list of
        versions puts back the three steps. (The line kept naming the last model's version.)"""
        if self._step_pending and self.state.trace is not None and not self.state.input_first:
            self._step_pending = False
            self.next_version()
            return
        self._show_refusal()
        if self._mode in ("state", "steps") and self._held is not None and self._keys() == self._about:
            self._say(*self._held)  # the state ② or ③ spoke of is back (a refused upload put the fields back)
        elif self._mode == "step":
            self._say_version()
        elif self._mode in ("break", "why", "state") and self.state.model is not None \
                and self.state.model.name != self._model_name:
            self._say([(self.steps(), False)], "steps")
        elif self._mode == "state" or (self._mode in ("break", "why") and self._keys() != self._about):
            self._say_state()  # a variant, layer or pipeline chosen by hand: the line of ② or ③ no longer holds

    def _say_state(self) -> None:
        """The line for a state the user chose by hand (a variant, its layer, a pipeline): the variant now applied
        and where, with the next click from what the run shows; the three steps when no variant is on. (After ②,
        choosing another variant left "Layer 1 now has an extra user..." above a banner that said otherwise.)"""
        s = self.state
        if s.variant == "none":
            self._say([(self.steps(), False)], "steps")
            return
        self._model_name = s.model.name if s.model is not None else ""
        where = ("to every layer (a size gate is model-wide, so Layer to break does not apply)"
                 if s.variant == SHAPE_VARIANT else f"to layer {s.variant_layer}")
        # the run shown is of this state (not the last one's, while the new run is on its way): its verdicts hold
        shown = not s.input_first and not s.busy and s.runs._model_key == s.model_key()
        unfused = self.unfused_layers() if shown else []
        head = (f"Next: ③ to ask why layer {unfused[0]} did not fuse, or ① to step through the passes. " if unfused
                else "Next: ① to step through the passes, or ② to break a layer. ")
        self._say([(head, True), (f"The teaching variant now applied is '{VARIANT_LABELS[s.variant]}', {where}: the "
                                  "banner below says what it did.", False)], "state")

    def _show_refusal(self) -> None:
        """After ②, once its run is shown: step to the version of the pass whose guard refused the broken layer, so
        the panes show that rejection (they stayed at the version shown before, a pass that refused nothing)."""
        s = self.state
        if self._jump is None or s.trace is None or s.trace is self._jump[1] or s.input_first \
                or s.runs._model_key != s.model_key():  # not yet ②'s run (a run of the model as built, put back)
            return
        layer = self._jump[0]
        if s.variant != BREAK_VARIANT or s.variant_layer != layer:  # changed meanwhile: show what was chosen
            self._jump = None
            return
        try:
            first = s.layer_status(layer).first
        except SessionError:  # a run without that layer: nothing to show, the banner says why
            first = None
        self._jump = None
        if first is not None:
            with contextlib.suppress(ValueError):  # the pass is not shown (the filter hides it): stay
                s.step_to(f"after {first.pass_name}")

    def unfused_layers(self) -> list[int]:
        """The layers of the shown run that did not fuse (their verdict, as the Why tab words it), in order; [] before
        a run or when every layer fused."""
        s = self.state
        out = []
        for layer in s.layers():
            try:
                if not s.layer_status(layer).fused:
                    out.append(layer)
            except SessionError:  # no run yet, or a layer the run does not hold
                continue
        return out

    def _next_after_step(self, last: bool = False) -> str:
        """What to click after ①, from what the run shows: with a layer that did not fuse (② pressed before, or the
        model's own), ③ asks why; with every layer fused, ② breaks one ("① again, then ②" after ② misled). At the
        `last` version, ① goes back to the input, and the line says so (it said "① again" and wrapped silently).
        Where ② does not apply (an ONNX export, IR text: `_unavailable`), the line does not send the user to it (it
        said "then ②" beside a disabled ②); ③ asks why of any layer."""
        unfused = self.unfused_layers()
        no_break = bool(self.brk.disabled)
        if last:
            other = (f"③ to ask why layer {unfused[0]} did not fuse" if unfused else
                     "③ to ask why a layer fused" if no_break else "② to break a layer")
            return f"Next: {other}, or ① back to the input: this is the last version. "
        if unfused:
            return f"Next: ① again, or ③ to ask why layer {unfused[0]} did not fuse. "
        return "Next: ① again, or ③ to ask why a layer fused. " if no_break else "Next: ① again, then ②. "

    def _say_version(self) -> None:
        s = self.state
        n = len(s.version_labels)
        if not n:
            return
        k = min(s.version, n - 1)
        name = s.model.name if s.model is not None else "the model"
        number = s.version_index(k)  # as the version list and the timing chart number it (`version_name`)
        step = s.trace.steps[number - 1] if number and s.trace is not None else None
        framed = self._framed(step)
        panes = (": on the Graph tab, one pane: the graph as read, before any pass (① steps on to the first pass "
                 "that changed it)." if number == 0 else
                 f": on the Graph tab, left, the graph before this pass ({framed}); right, "
                 "after it.")  # the Why tab may be the one open: the sentence names where the panes are
        last = n > 1 and k == n - 1
        self._say([(self._next_after_step(last), True), ("Showing ", False), (s.version_labels[k], True),
                   (f" (version {number}) of ", False), (name, True), (panes, False)], "step")

    def _framed(self, step: PassStep | None) -> str:
        """What the before pane shows of `step`'s matches, as the drawing draws them: in the full view each match
        framed in its colour (`viz.styles.match_frames`: "framed in green" was true of the first match only); in the
        focus view the selected layer's matches, each in its own colour; in the layer boxes no frame at all."""
        s = self.state
        matches = list(step.matches) if step is not None else []
        if not matches:
            return "it matched no pattern, so nothing is framed"  # dead_code_elimination matches nothing
        view = s.resolved_view()
        if view == COLLAPSED:
            return (f"one box per layer, coloured by its status; the View full frames each of its {len(matches)} "
                    "match(es)")
        if view == FOCUS and s.selected_layer is not None:
            mine = sum(1 for m in matches if m.layer == s.selected_layer)
            return (f"layer {s.selected_layer}'s {mine} match(es) framed, each in its own colour" if mine else
                    f"nothing framed: its matches lie outside layer {s.selected_layer}")
        return match_frames(len(matches))

    def fold(self) -> None:
        """Once a step is used, the strip folds to its buttons and line (one 34 px row): the title and the drop zone
        (the sidebar's Upload does the same) give their height to the graph, and a "drop .onnx" button in the row
        brings the zone back (`show_drop`). Idempotent."""
        if self.folded:
            return
        self.folded = True
        self.title.visible = False
        if self.dropper is not None:
            self.dropper.visible = False
            self.drop_btn.visible = True  # the zone one click away, in the row's height

    def show_drop(self) -> None:
        """The folded strip's "drop .onnx" button: show the drop zone again in its place (the strip grows by the
        zone's height until the page is reloaded; the graph keeps the rest)."""
        if self.dropper is not None:
            self.dropper.visible = True
            self.drop_btn.visible = False

    def next_version(self) -> None:
        """Show the next version (after the last: the input again)."""
        self.fold()
        s = self.state
        if s.trace is None or s.input_first:  # the passes are still running (the page opened on the input graph)
            self._step_pending = True  # ① did nothing: clicked this early, the versions were the input alone
            self._say([(PASSES_PENDING, False)], "steps")
            return
        n = len(s.version_labels)
        if n:
            self._mode, self._held = "step", None
            s.version = (s.version + 1) % n
            self._say_version()

    def break_layer(self) -> None:
        """Apply `BREAK_VARIANT` to `BREAK_LAYER` (or layer 0) and re-run; the banner names the guard it trips."""
        self.fold()
        s = self.state
        reason = self._unavailable()
        if reason:
            self._reason_said = reason
            self._say([(reason, False)], "reason")
            return
        layers = s.layers()  # the layer "Layer to break" shows (one field): else `BREAK_LAYER`, else the first
        layer = next((k for k in (s.variant_layer, BREAK_LAYER) if k in layers), layers[0] if layers else 0)
        self._jump = (layer, s.trace)  # the run this starts shows the pass that refused the layer (`_show_refusal`)
        back = s.shown_source()  # a refused load: back to the model shown, whose layer this breaks
        source = {"source": back[0], **back[1]} if back is not None else {}
        s.param.update(**source, variant_layer=layer, variant=BREAK_VARIANT)
        self._show_refusal()
        self._model_name = s.model.name if s.model is not None else ""
        self._about = self._keys()
        self._held = ([("Next: ③. ", True), (BREAK_WORDS.format(layer=layer), False)], "break")
        self._say(*self._held)

    def ask_why(self) -> None:
        """Open the Why tab on a layer that did not fuse (the selected one, else the first: the one ② broke); with
        every layer fused, on the selected layer (else the applied variant's, else the first), and the line says it
        fused and what to try (② breaks one): the Why tab then lists only patterns that matched or did not apply."""
        self.fold()
        s = self.state
        layers, unfused = s.layers(), self.unfused_layers()
        if unfused and (s.selected_layer is None or s.selected_layer not in unfused):
            s.selected_layer = unfused[0]  # ③ asks why a layer did not fuse: one that did has no answer
        elif s.selected_layer is None and layers:
            s.selected_layer = s.variant_layer if s.variant != "none" and s.variant_layer in layers else layers[0]
        self.show_why()
        self._model_name = s.model.name if s.model is not None else ""
        self._about = self._keys()
        layer = s.selected_layer
        more = "More: the Matches & rejections table, the Timing tab, the controls in the sidebar."
        if layer is None:
            self._say([("Next: the Why tab below. ", True), ("This graph's nodes name no layer, so it words the run "
                                                            f"as a whole. {more}", False)], "why")
        elif layer in unfused:
            self._say([("Next: the Why tab below. ", True), (f"It lists each pattern's outcome on layer {layer} and "
                                                            f"the first guard that failed. {more}", False)], "why")
        elif self.brk.disabled:  # ② does not apply to this model (an ONNX export, IR text): not sent to it
            self._say([(self._fused_words(layer), True),
                       (f"The Why tab below lists each pattern's outcome on it. {more}", False)], "why")
        else:
            self._say([(self._fused_words(layer), True),
                       ("Next: ② breaks a layer on purpose, then ③ shows the guard that refused it.", False)], "why")
        self._held = (self._parts, "why")

    def _fused_words(self, layer: int) -> str:
        """The strip's line for a fused layer, in the verdict's own words (`LayerVerdict.status`): "nothing refused
        it" only where nothing did; a layer fused only as far as legal or as far as rlxviz's ops go (or held back by
        them) says so, and what rlxviz lacks, as the headline does (`text.layer_fix_words`, what `text.gap_words`
        says: a compiler fix, nothing in the model to change, or alone not enough, or a workaround in the model too;
        deit read "Layer 0 fused: nothing refused it." over a Why tab listing the attention block rlxviz has no form
        for, newcomer run 5)."""
        v = self.state.verdict().layer(layer)
        if v.status == "fused":
            return f"Layer {layer} fused: nothing it expects was refused. "
        asks = layer_fix_words([v], len(v.gap_forms) > 1)  # the gap records, as the headline words them
        lacks = f" (rlxviz lacks {', '.join(v.gap_forms)}: {asks})" if v.op_gaps else ""
        return f"Layer {layer} {v.status}{lacks}; the Why tab says what stood in the way. "

    def dismiss(self) -> None:
        """Hide the strip (its ✕) until the header's "Start here" (`back`) brings it back."""
        self.dismissed = True
        self.strip.visible = False
        self.back.visible = True

    def restore(self) -> None:
        """Bring the dismissed strip back (the header's `back` button), on the tabs its steps use."""
        self.dismissed = False
        self.back.visible = False
        self.strip.visible = self._tab_shows

    def show_on(self, shown: bool) -> None:
        """Show the strip (unless dismissed) or hide it: the page shows it on the tabs its steps use (Graph and
        Why), not over the table, timing, IR and editor tabs, whose room it would take."""
        self._tab_shows = shown
        self.strip.visible = shown and not self.dismissed

    def __panel__(self) -> pn.viewable.Viewable:
        return self.strip


__all__ = ["BREAK_LAYER", "BREAK_VARIANT", "NOTE_CSS", "PASSES_DO", "STEPS", "STEPS_CSS", "STEPS_NO_BREAK", "StartHere",
           "note_html"]
