package lapd

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lapd-dev/lapd/internal/kvrep"
	"github.com/lapd-dev/lapd/mcp"
)

// bindingTTL is how long an MCP binding is kept in the cluster's bucket
// (the default token lifetime: a binding outliving its token only ever gets
// "revoked" or "auth-failed" from LAP).
const bindingTTL = 24 * time.Hour

// natsBindings keeps MCP bindings (handle → LAP base and agent token) in the
// JetStream KV bucket "<cluster>_mcp", so a handle from connect_session on
// one node works on every node. The handle is the capability and the key:
// the bucket key is SHA-256(handle), the value the token sealed with
// AES-256-GCM under a key derived from the handle, so the bucket alone
// reveals no token.
type natsBindings struct {
	kv jetstream.KeyValue
}

var _ mcp.SharedBindings = (*natsBindings)(nil)

func openNATSBindings(ctx context.Context, nc *nats.Conn, bucket string, replicas int) (*natsBindings, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := kvrep.Bucket(ctx, js, jetstream.KeyValueConfig{Bucket: bucket, History: 1, TTL: bindingTTL, Storage: jetstream.FileStorage}, replicas)
	if err != nil {
		return nil, fmt.Errorf("lapd: MCP bindings: %w", err)
	}
	return &natsBindings{kv: kv}, nil
}

func bindingKeys(handle string) (kvKey string, aead cipher.AEAD) {
	id := sha256.Sum256([]byte("lapd mcp binding id\x00" + handle))
	key := sha256.Sum256([]byte("lapd mcp binding key\x00" + handle))
	block, _ := aes.NewCipher(key[:]) // a 32-byte key never fails
	aead, _ = cipher.NewGCM(block)
	return "b." + hex.EncodeToString(id[:16]), aead
}

type sealedBinding struct {
	Base  string `json:"base,omitempty"`
	Token string `json:"token"`
}

func (n *natsBindings) Put(ctx context.Context, handle, base, token string) error {
	key, aead := bindingKeys(handle)
	plain, _ := json.Marshal(sealedBinding{Base: base, Token: token})
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	_, err := n.kv.Put(ctx, key, aead.Seal(nonce, nonce, plain, []byte(key)))
	return err
}

func (n *natsBindings) Get(ctx context.Context, handle string) (string, string, bool, error) {
	key, aead := bindingKeys(handle)
	e, err := n.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, err
	}
	v := e.Value()
	if len(v) < aead.NonceSize() {
		return "", "", false, nil
	}
	plain, err := aead.Open(nil, v[:aead.NonceSize()], v[aead.NonceSize():], []byte(key))
	if err != nil {
		return "", "", false, nil
	}
	var sb sealedBinding
	if json.Unmarshal(plain, &sb) != nil || sb.Token == "" {
		return "", "", false, nil
	}
	return sb.Base, sb.Token, true, nil
}

func (n *natsBindings) Delete(ctx context.Context, handle string) error {
	key, _ := bindingKeys(handle)
	return n.kv.Delete(ctx, key)
}
