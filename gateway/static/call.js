// Voice calls with Pepper from the chat page, over WebRTC (gateway/browser_calls.py).
// Enhances #call-button (adds one to the header if the page has none): call, mute, hang up, and
// the call's transcript, line by line, under the button. The offer carries every ICE candidate
// (no trickle); the signed-in session's CSRF token goes with each request.
(() => {
  "use strict";
  let button = document.getElementById("call-button");
  if (!button) {
    button = document.createElement("button");
    button.id = "call-button";
    button.type = "button";
    (document.querySelector("header") || document.body).appendChild(button);
  }
  button.textContent = "Call Pepper";
  button.hidden = false;

  const style = document.createElement("style");
  style.textContent =
    "#call-panel { font-size: .85rem; max-width: 28rem; }" +
    "#call-transcript { margin: .25rem 0 0; padding-left: 1.2rem; max-height: 8rem; overflow-y: auto; }" +
    "#call-transcript .you { font-weight: 600; }";
  document.head.appendChild(style);
  const panel = document.createElement("div");
  panel.id = "call-panel";
  panel.hidden = true;
  panel.innerHTML =
    '<span id="call-status" role="status"></span> ' +
    '<button type="button" id="call-mute">Mute</button> ' +
    '<button type="button" id="call-hangup">Hang up</button>' +
    '<ol id="call-transcript" aria-live="polite"></ol>' +
    '<audio id="call-audio" autoplay></audio>';
  button.insertAdjacentElement("afterend", panel);
  const status = panel.querySelector("#call-status");
  const muteButton = panel.querySelector("#call-mute");
  const hangupButton = panel.querySelector("#call-hangup");
  const transcript = panel.querySelector("#call-transcript");
  const audio = panel.querySelector("#call-audio");

  // What the page heard, for people (the status) and for tests: the received track's level.
  // ``audio``: the microphone's processing; the echo canceller keeps Pepper from hearing itself
  // through the speakers (a test with a fake microphone turns it off: it cannot tell a file from
  // a person talking over the reply).
  const state = {
    phase: "idle", callId: null, levels: [], reason: null, error: null,
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  };
  window.pepperCall = state;
  let pc = null, mic = null, meter = null, context = null;

  async function csrf() {
    const r = await fetch("/api/session");
    if (!r.ok) throw new Error("sign in first");
    return (await r.json()).csrf_token;
  }

  function say(text) { status.textContent = text; }

  function line(who, text) {
    const li = document.createElement("li");
    li.className = "call-line " + who;
    li.textContent = (who === "you" ? "You: " : "Pepper: ") + text;
    transcript.appendChild(li);
  }

  function gathered(peer) {
    if (peer.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => { if (peer.iceGatheringState === "complete") resolve(); };
      peer.addEventListener("icegatheringstatechange", done);
      setTimeout(resolve, 3000); // host candidates come at once; never wait on a STUN that is not there
    });
  }

  function measure(track) {
    // Energy in the received track: WebAudio reads the stream the <audio> element plays.
    context = new AudioContext();
    const source = context.createMediaStreamSource(new MediaStream([track]));
    const analyser = context.createAnalyser();
    analyser.fftSize = 1024;
    source.connect(analyser);
    const samples = new Float32Array(analyser.fftSize);
    meter = setInterval(() => {
      analyser.getFloatTimeDomainData(samples);
      let sum = 0;
      for (const s of samples) sum += s * s;
      state.levels.push([performance.now(), Math.sqrt(sum / samples.length)]);
      if (state.levels.length > 6000) state.levels.splice(0, 1000);
    }, 20);
  }

  function finish(text) {
    state.phase = "idle";
    if (meter) clearInterval(meter);
    if (context) context.close();
    if (mic) mic.getTracks().forEach((t) => t.stop());
    if (pc) pc.close();
    pc = mic = meter = context = null;
    state.callId = null;
    muteButton.textContent = "Mute";
    button.disabled = false;
    hangupButton.disabled = true;
    muteButton.disabled = true;
    say(text);
  }

  async function call() {
    if (state.phase !== "idle") return;
    state.phase = "connecting";
    state.error = state.reason = null;
    button.disabled = true;
    panel.hidden = false;
    transcript.textContent = "";
    say("Connecting…");
    try {
      const token = await csrf();
      mic = await navigator.mediaDevices.getUserMedia({ audio: state.audio });
      pc = new RTCPeerConnection({ iceServers: [] });
      mic.getTracks().forEach((t) => pc.addTrack(t, mic));
      const channel = pc.createDataChannel("transcript");
      channel.onmessage = (e) => {
        const m = JSON.parse(e.data);
        if (m.type === "line") line(m.who, m.text);
        else if (m.type === "ended") { state.reason = m.reason; finish("Call ended."); }
      };
      pc.ontrack = (e) => {
        audio.srcObject = e.streams[0] || new MediaStream([e.track]);
        measure(e.track);
      };
      pc.onconnectionstatechange = () => {
        if (pc && pc.connectionState === "connected") { state.phase = "live"; say("On the call"); }
        else if (pc && ["failed", "closed"].includes(pc.connectionState)) finish("Call ended.");
      };
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      const r = await fetch("/api/calls", {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": token },
        body: JSON.stringify({ type: "offer", sdp: pc.localDescription.sdp }),
      });
      const answer = await r.json();
      if (!r.ok) throw new Error(answer.message || "the call could not start");
      state.callId = answer.call_id;
      await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
      hangupButton.disabled = false;
      muteButton.disabled = false;
    } catch (err) {
      state.error = String(err.message || err);
      finish("Could not call: " + state.error);
    }
  }

  async function hangUp() {
    const id = state.callId;
    finish("Call ended.");
    if (id) {
      const token = await csrf();
      await fetch(`/api/calls/${encodeURIComponent(id)}/hangup`, { method: "POST", headers: { "X-CSRF-Token": token } });
    }
  }

  function toggleMute() {
    if (!mic) return;
    const track = mic.getAudioTracks()[0];
    track.enabled = !track.enabled;
    muteButton.textContent = track.enabled ? "Mute" : "Unmute";
    muteButton.setAttribute("aria-pressed", String(!track.enabled));
  }

  button.addEventListener("click", call);
  hangupButton.addEventListener("click", hangUp);
  muteButton.addEventListener("click", toggleMute);
  hangupButton.disabled = muteButton.disabled = true;
})();
